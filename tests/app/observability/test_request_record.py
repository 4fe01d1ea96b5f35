"""Request ids, access-log lines and in-flight counts of the HTTP API, in-process, real store."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from fastapi import FastAPI

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.observability import access_log
from app.observability.metrics import InFlight
from app.observability.request_record import CLIENT_CLOSED, RequestRecord
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import bearer, shipped_limits

ACCESS_FIELDS = {
    "request_id",
    "method",
    "path",
    "model_type",
    "status",
    "stream",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "duration_ms",
    "key_id",
}


@pytest.fixture
def app(store: KeyStore) -> FastAPI:
    app = create_api(
        ModelEndpoints({}, created=0), KeyVerifier(store), shipped_limits(), UsageMeter(store)
    )

    @app.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("internal detail")

    return app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def access_lines() -> Iterator[Callable[[], list[logging.LogRecord]]]:
    """The access-log records of the test (Ray Serve's logger may not reach the root)."""
    logger, collected = access_log.logger, Collected()
    level = logger.level
    logger.addHandler(collected)
    logger.setLevel(logging.INFO)
    yield lambda: collected.records
    logger.removeHandler(collected)
    logger.setLevel(level)


def fields(record: logging.LogRecord) -> dict:
    return {name: getattr(record, name) for name in ACCESS_FIELDS}


async def test_a_request_without_an_id_gets_one(client: httpx.AsyncClient, access_lines):
    # Under Ray Serve, Ray makes the id and echoes it (tests/e2e/test_observability.py).
    response = await client.get("/v1/models")
    generated = response.headers["x-request-id"]
    assert uuid.UUID(generated).version == 4
    await client.get("/v1/models", headers={"x-request-id": "trace-42"})
    await client.get("/v1/models", headers={"x-request-id": "not sane"})
    ids = [r.request_id for r in access_lines()]
    assert ids[:2] == [generated, "trace-42"] and uuid.UUID(ids[2])


async def test_an_unexpected_error_quotes_the_request_id(client: httpx.AsyncClient, access_lines):
    response = await client.get("/v1/boom", headers={"x-request-id": "boom-1"})
    assert response.status_code == 500
    assert "boom-1" in response.json()["error"]["message"]
    assert "internal detail" not in response.text
    [line] = access_lines()
    assert (line.request_id, line.status, line.path) == ("boom-1", 500, "/v1/boom")


async def test_one_access_line_per_request_with_the_key_id_never_the_key(
    client: httpx.AsyncClient, store: KeyStore, access_lines
):
    user = await store.create_user("ada@example.com")
    issued = await store.create_key(user.id)
    await client.get("/v1/account", headers={**bearer(issued.key), "x-request-id": "ok-1"})
    await client.get("/v1/account", headers={**bearer(issued.key + "x"), "x-request-id": "bad-1"})
    await client.get("/health")
    await client.get("/ready")
    lines = access_lines()
    assert [fields(r) for r in lines] == [
        {
            "request_id": "ok-1",
            "method": "GET",
            "path": "/v1/account",
            "model_type": None,
            "status": 200,
            "stream": False,
            "prompt_tokens": None,
            "completion_tokens": None,
            "ttft_ms": None,
            "duration_ms": lines[0].duration_ms,
            "key_id": issued.id,
        },
        {
            "request_id": "bad-1",
            "method": "GET",
            "path": "/v1/account",
            "model_type": None,
            "status": 401,
            "stream": False,
            "prompt_tokens": None,
            "completion_tokens": None,
            "ttft_ms": None,
            "duration_ms": lines[1].duration_ms,
            "key_id": None,
        },
    ]
    assert all(r.duration_ms >= 0 for r in lines)
    assert not any(issued.key in str(r.__dict__) for r in lines)


async def test_a_stranger_refused_before_routing_is_logged_under_its_route(
    client: httpx.AsyncClient, access_lines
):
    # AuthenticateFirst answers 401 before the router runs; the line still names the route.
    body = {"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/no/such/route"):
        response = await client.post(path, json=body, headers=bearer("sk-unknown"))
        assert response.status_code == 401
    assert [(r.path, r.status) for r in access_lines()] == [
        ("/v1/chat/completions", 401),
        ("/v1/responses", 401),
        ("unmatched", 401),
    ]


async def test_an_unknown_path_is_logged_without_its_path(client: httpx.AsyncClient, access_lines):
    await client.get("/v1/no/such/thing/a1b2c3")
    [line] = access_lines()
    assert (line.path, line.status) == ("unmatched", 404)


def test_a_stream_counts_as_waiting_then_streaming_then_gone():
    in_flight = InFlight()
    record = RequestRecord("r", 0.0, in_flight)
    record.sent_to("ServiceAi-Fast", stream=True)
    assert (in_flight.waiting["ServiceAi-Fast"], in_flight.streaming["ServiceAi-Fast"]) == (1, 0)
    record.first_token()
    assert (in_flight.waiting["ServiceAi-Fast"], in_flight.streaming["ServiceAi-Fast"]) == (0, 1)
    record.release()
    record.release()
    assert (in_flight.waiting["ServiceAi-Fast"], in_flight.streaming["ServiceAi-Fast"]) == (0, 0)


def test_a_request_refused_by_its_model_type_stops_waiting():
    in_flight = InFlight()
    record = RequestRecord("r", 0.0, in_flight)
    record.sent_to("ServiceAi-Pro", stream=False)
    record.release()
    assert in_flight.waiting["ServiceAi-Pro"] == 0
    assert record.status(503) == 503


@pytest.mark.parametrize(
    ("ended", "error_status", "outcome"),
    [(True, None, 200), (True, 503, 503), (False, None, CLIENT_CLOSED)],
)
def test_the_outcome_of_a_stream(ended: bool, error_status: int | None, outcome: int):
    record = RequestRecord("r", 0.0, InFlight())
    record.sent_to("ServiceAi-Coder", stream=True)
    record.first_token()
    if ended:
        record.stream_ended(error_status=error_status)
    assert record.status(200) == outcome
