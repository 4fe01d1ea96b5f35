"""Request bodies over SERVICEAI_MAX_BODY_BYTES: 413 in the envelope, refused while read; any
early answer goes out whole and ends only after the rest of the body is dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.accounts.auth import KeyVerifier
from app.config.settings import Settings
from app.http.app import create_api
from app.http.body_limit import DEFAULT_MAX_BODY_BYTES, DRAIN_FACTOR, BodyLimit
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import bearer, shipped_limits
from tests.app.http.asgi_exchange import Exchange, http_scope
from tests.conftest import error_of

LIMIT = 64 * 1024
PIECE = b" " * 4096


@pytest.fixture
async def limited(store) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """The API with a 64 KiB body limit, and a valid key of its store."""
    app = create_api(
        ModelEndpoints({}, created=0),
        KeyVerifier(store),
        shipped_limits(),
        UsageMeter(store),
        max_body_bytes=LIMIT,
    )
    user = await store.create_user("ada@example.com")
    key = (await store.create_key(user.id, "first")).key
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client, key


def assert_too_large(response: httpx.Response) -> None:
    error = error_of(response, 413)
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert f"{LIMIT} bytes" in error["message"]


async def test_a_declared_length_over_the_limit_is_refused_unread(limited):
    client, key = limited
    response = await client.post(
        "/v1/account/keys",
        content=b"{}",
        headers={
            **bearer(key),
            "Content-Length": str(LIMIT + 1),
            "Content-Type": "application/json",
        },
    )
    assert_too_large(response)


async def test_a_body_over_the_limit_on_the_messages_api_is_refused_in_anthropics_envelope(
    limited,
):
    """Found by the fuzzer: /v1/messages/count_tokens answered a 413 in OpenAI's envelope."""
    client, key = limited
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = await client.post(
            path,
            content=b"x" * (LIMIT + 1),
            headers={**bearer(key), "Content-Type": "application/json"},
        )
        assert response.status_code == 413
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert f"{LIMIT} bytes" in body["error"]["message"]


def recording_app(seen: list[Message], status: int = 200) -> ASGIApp:
    """An app that reads the whole body (keeping what it saw) and answers `status`."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            seen.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


async def test_the_app_never_sees_a_declared_body_over_the_limit():
    seen: list[Message] = []
    exchange = Exchange([PIECE] * (LIMIT // len(PIECE) + 1))
    await exchange.run(
        BodyLimit(recording_app(seen), max_body_bytes=LIMIT),
        http_scope("/", ("content-length", str(LIMIT + len(PIECE)))),
    )
    assert exchange.status == 413 and seen == []
    assert b"request_too_large" in exchange.answer


async def test_a_chunked_body_is_cut_off_at_the_limit():
    seen: list[Message] = []
    exchange = Exchange([PIECE] * (4 * LIMIT // len(PIECE)))
    await exchange.run(
        BodyLimit(recording_app(seen), max_body_bytes=LIMIT),
        http_scope("/", ("transfer-encoding", "chunked")),
    )
    assert exchange.status == 413
    # The app held no more than the cap and a piece, then read a disconnect.
    assert sum(len(m.get("body", b"")) for m in seen) <= LIMIT + len(PIECE)
    assert seen[-1] == {"type": "http.disconnect"}


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_refusal_goes_out_whole_then_the_rest_of_the_body_is_dropped(framing):
    # Closing with unread bytes resets the connection, and a reset can cut the answer off
    # in HAProxy: the response ends only once the whole body has been read.
    pieces = [PIECE] * (4 * LIMIT // len(PIECE))
    header = (
        ("content-length", str(4 * LIMIT))
        if framing == "content-length"
        else ("transfer-encoding", "chunked")
    )
    exchange = Exchange(pieces)
    await exchange.run(BodyLimit(recording_app([]), max_body_bytes=LIMIT), http_scope("/", header))
    assert exchange.status == 413
    assert exchange.bytes_read() == 4 * LIMIT and exchange.ended_after_the_last_read()
    if framing == "content-length":
        assert exchange.reads_before_answer() == 0


async def test_an_early_answer_goes_out_at_once_and_ends_after_the_body_is_dropped():
    async def stranger_refused(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    exchange = Exchange([PIECE] * 10)
    await exchange.run(
        BodyLimit(stranger_refused, max_body_bytes=LIMIT),
        http_scope("/", ("content-length", str(10 * len(PIECE)))),
    )
    assert exchange.status == 401 and exchange.answer == b"{}"
    assert exchange.reads_before_answer() == 0
    assert exchange.bytes_read() == 10 * len(PIECE) and exchange.ended_after_the_last_read()


async def test_what_is_dropped_is_bounded():
    app = BodyLimit(recording_app([]), max_body_bytes=LIMIT, read_timeout_s=0.3)
    # Far over the cap: refused without reading a byte.
    huge = Exchange([PIECE] * 4, then="stall")
    await huge.run(app, http_scope("/", ("content-length", str((DRAIN_FACTOR + 1) * LIMIT))))
    assert huge.status == 413 and huge.bytes_read() == 0
    # A chunked body is dropped only up to DRAIN_FACTOR times the cap.
    endless = Exchange([PIECE] * ((DRAIN_FACTOR + 2) * LIMIT // len(PIECE)), then="stall")
    await endless.run(app, http_scope("/", ("transfer-encoding", "chunked")))
    assert endless.status == 413 and endless.bytes_read() <= DRAIN_FACTOR * LIMIT + len(PIECE)
    # A client that stops sending is waited for only until the read deadline.
    stalled = Exchange([PIECE] * (2 * LIMIT // len(PIECE)), then="stall")
    await stalled.run(app, http_scope("/", ("content-length", str(3 * LIMIT))))
    assert stalled.status == 413 and stalled.bytes_read() == 2 * LIMIT
    # A client waiting for `100 Continue` is answered without being asked for the body.
    waiting = Exchange([PIECE], then="stall")
    await waiting.run(
        app, http_scope("/", ("content-length", str(2 * LIMIT)), ("expect", "100-continue"))
    )
    assert waiting.status == 413 and waiting.bytes_read() == 0
    # A client that leaves is not waited for.
    leaving = Exchange([PIECE] * 2, then="leave")
    await leaving.run(app, http_scope("/", ("content-length", str(3 * LIMIT))))
    assert leaving.status == 413 and leaving.log[-2][1] == {"type": "http.disconnect"}


async def test_a_body_too_slow_is_cut_off_with_408_and_not_waited_for_again():
    seen: list[Message] = []
    exchange = Exchange([PIECE], then="stall")
    started = asyncio.get_running_loop().time()
    await exchange.run(
        BodyLimit(recording_app(seen), max_body_bytes=LIMIT, read_timeout_s=0.3),
        http_scope("/", ("content-length", str(2 * len(PIECE)))),
    )
    assert exchange.status == 408 and b"request_timeout" in exchange.answer
    assert asyncio.get_running_loop().time() - started < 5


async def test_the_limit_holds_before_authentication(limited):
    client, _ = limited
    response = await client.post(
        "/v1/chat/completions",
        content=b"x" * (LIMIT + 1),
        headers={"Content-Type": "application/json"},
    )
    assert_too_large(response)


async def test_a_body_within_the_limit_is_served(limited):
    client, key = limited
    name = "n" * 100
    body = b'{"name": "%s"%s}' % (name.encode(), b" " * (LIMIT - 200))
    response = await client.post(
        "/v1/account/keys",
        content=body,
        headers={**bearer(key), "Content-Type": "application/json"},
    )
    assert response.status_code == 201 and response.json()["name"] == name


def test_the_limit_is_a_setting_of_a_few_mib(monkeypatch):
    assert 1 * 2**20 <= Settings().max_body_bytes == DEFAULT_MAX_BODY_BYTES <= 4 * 2**20
    monkeypatch.setenv("SERVICEAI_MAX_BODY_BYTES", "65536")
    assert Settings().max_body_bytes == 65536
