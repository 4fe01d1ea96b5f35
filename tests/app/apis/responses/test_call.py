"""The ingress side of POST /v1/responses with a stand-in model handle (one layer only: the
real replica, vLLM's handler included, is proved by tests/e2e/test_responses.py).

What the ingress sends the replica (the whole conversation, store off), what it stores, and
that a stream's last event is relayed only once the response is stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.accounts.keystore.responses import ResponseStore
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from deployments.wire import ModelInfo, ReplyPart
from tests.app.conftest import bearer, shipped_limits
from tests.app.serve_fakes import assigned, serve_response
from tests.conftest import error_of

FAST = "ServiceAi-Fast"


def reply(body: dict[str, Any], text: str, status: str = "completed") -> dict:
    """The response object vLLM makes for `body`, with what the gateway does with it echoed."""
    return {
        "id": body["request_id"],
        "object": "response",
        "model": FAST,
        "status": status,
        "store": body["store"],
        "previous_response_id": body["previous_response_id"],
        "output": [
            {
                "id": f"msg_{len(body['input'])}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 7, "output_tokens": 2, "total_tokens": 9},
    }


class Stream:
    """What `handle.reply.remote(...)` and `handle.stream.remote(...)` return: parts."""

    def __init__(self, parts: list[ReplyPart]) -> None:
        self._parts = iter(parts)
        self.cancelled = False
        self._replica_result_future = assigned()

    def __aiter__(self) -> AsyncIterator[ReplyPart]:
        return self

    async def __anext__(self) -> ReplyPart:
        try:
            return next(self._parts)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        self.cancelled = True


class Info:
    """`handle.info.remote()`: what the replica tells the ingress about its model."""

    def remote(self) -> Any:
        return serve_response(answer=ModelInfo(FAST, max_model_len=2048, tool_call_parser="hermes"))


class Replica:
    """A model handle whose replica answers /v1/responses like the real one, recording each
    body it gets."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.info = Info()
        self.reply = self.stream = self
        # A long conversation is measured before admission, as for chat.
        self.prompt_tokens = SimpleNamespace(remote=lambda api, body: serve_response(answer=10))

    def options(self, **_: Any) -> Replica:
        return self

    def remote(self, api: str, body: dict, *feed: Any) -> Stream:
        assert api == "responses"
        self.calls.append(body)
        text = f"answer {len(self.calls)}"
        if not body.get("stream"):
            return Stream([ReplyPart(orjson.dumps(reply(body, text)), 7, 2, True)])
        created = {
            "type": "response.created",
            "sequence_number": 0,
            "response": {**reply(body, ""), "status": "in_progress", "output": []},
        }
        delta = {
            "type": "response.output_text.delta",
            "sequence_number": 1,
            "delta": text,
            "item_id": "m",
            "output_index": 0,
            "content_index": 0,
        }
        done = {"type": "response.completed", "sequence_number": 2, "response": reply(body, text)}
        events = b"".join(
            b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps(e))
            for e in (created, delta)
        )
        return Stream([ReplyPart(events, 7, 1), ReplyPart(b"", 7, 2, True, orjson.dumps(done))])


@pytest.fixture
async def setup(store: KeyStore):
    replica = Replica()
    user = await store.create_user("ada@example.com")
    key = (await store.create_key(user.id)).key
    responses = ResponseStore(store.database)
    app = create_api(
        ModelEndpoints({FAST: replica}, created=0),
        KeyVerifier(store),
        shipped_limits(),
        UsageMeter(store),
        response_store=responses,
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://test", headers=bearer(key)
    ) as client:
        yield client, replica, responses, user.id


async def test_the_replica_gets_the_whole_conversation_and_the_gateway_stores_it(setup):
    client, replica, responses, user_id = setup
    first = (
        await client.post(
            "/v1/responses", json={"model": FAST, "input": "one", "instructions": "be brief"}
        )
    ).json()
    second = (
        await client.post(
            "/v1/responses",
            json={"model": FAST, "input": "two", "previous_response_id": first["id"]},
        )
    ).json()
    body = replica.calls[1]
    # What the gateway does with the response, for the replica to echo (vLLM gets neither).
    assert (body["store"], body["previous_response_id"]) == (True, first["id"])
    assert "instructions" not in body  # instructions do not carry over, as at OpenAI
    texts = [(i["type"], i.get("role"), i["content"][0]["text"]) for i in body["input"]]
    assert texts == [
        ("message", "user", "one"),
        ("message", "assistant", "answer 1"),
        ("message", "user", "two"),
    ]
    stored = await responses.get(user_id, second["id"])
    assert stored.body == second and stored.input_items == body["input"]


async def test_a_stream_is_relayed_and_stored_before_its_last_event(setup):
    client, replica, responses, user_id = setup
    async with client.stream(
        "POST", "/v1/responses", json={"model": FAST, "input": "hi", "stream": True}
    ) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = []
        async for line in streamed.aiter_lines():
            if line.startswith("data: "):
                event = orjson.loads(line[6:])
                if event["type"] == "response.completed":  # stored already, before it was sent
                    assert (await responses.get(user_id, event["response"]["id"])).body == event[
                        "response"
                    ]
                events.append(event)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.output_text.delta",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == [0, 1, 2]


async def test_store_false_stores_nothing(setup):
    client, replica, responses, user_id = setup
    answer = (
        await client.post("/v1/responses", json={"model": FAST, "input": "hi", "store": False})
    ).json()
    assert answer["store"] is False
    assert (await client.get(f"/v1/responses/{answer['id']}")).status_code == 404


@asynccontextmanager
async def a_user_of(
    store: KeyStore, email: str, responses: ResponseStore
) -> AsyncIterator[tuple[httpx.AsyncClient, Replica]]:
    """A client with a new user's key, on an API that stores responses in `responses`."""
    replica = Replica()
    user = await store.create_user(email)
    key = (await store.create_key(user.id)).key
    app = create_api(
        ModelEndpoints({FAST: replica}, created=0),
        KeyVerifier(store),
        shipped_limits(),
        UsageMeter(store),
        response_store=responses,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test", headers=bearer(key)
    ) as client:
        yield client, replica


async def test_a_conversation_over_the_cap_is_refused_before_dispatch(store: KeyStore):
    responses = ResponseStore(store.database, max_bytes=2048)
    async with a_user_of(store, "bob@example.com", responses) as (client, replica):
        refused = await client.post("/v1/responses", json={"model": FAST, "input": "x" * 4096})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "response_too_large"
        assert refused.json()["error"]["param"] == "input"
        assert replica.calls == []
        accepted = await client.post(
            "/v1/responses", json={"model": FAST, "input": "x" * 4096, "store": False}
        )
        assert accepted.status_code == 200


async def test_a_user_past_the_bound_of_stored_responses_stores_no_more(store: KeyStore):
    """Stored responses had no per-user quota (4 MiB a row, 30 days): now one user's rows hold
    at most `user_max_bytes`; past it `store: true` is refused before dispatch, by name."""
    responses = ResponseStore(store.database, user_max_bytes=3000)
    async with a_user_of(store, "cy@example.com", responses) as (client, replica):
        kept = []
        for _ in range(20):  # each turn stores its input and reply (several hundred bytes)
            answer = await client.post("/v1/responses", json={"model": FAST, "input": "hi"})
            if answer.status_code != 200:
                break
            kept.append(answer.json())
        calls = len(replica.calls)
        error = error_of(answer, 400)
        assert (error["code"], error["param"]) == ("stored_responses_limit_reached", "store")
        assert "3000" in error["message"] and "store=false" in error["message"]
        assert len(replica.calls) == calls  # refused before a replica saw it
        assert 2 <= len(kept) < 20 and all(answer["store"] for answer in kept)
        unstored = await client.post(
            "/v1/responses", json={"model": FAST, "input": "hi", "store": False}
        )
        assert unstored.status_code == 200
        # Deleting one makes room again.
        for answer in kept:
            await client.delete(f"/v1/responses/{answer['id']}")
        again = await client.post("/v1/responses", json={"model": FAST, "input": "hi"})
        assert again.status_code == 200 and again.json()["store"] is True
