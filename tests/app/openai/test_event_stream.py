"""The SSE response settles a request however it ends, even before its first event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from starlette.requests import ClientDisconnect

from app.openai.sse import EventStream, line_safe

SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/chat/completions",
    "headers": [],
    "asgi": {"spec_version": "2.4"},
}


class Events:
    def __init__(self) -> None:
        self.started = False
        self.finally_ran = False

    async def __call__(self) -> AsyncIterator[str]:
        self.started = True
        try:
            yield "one"
            await asyncio.sleep(30)
            yield "two"
        finally:
            self.finally_ran = True


async def gone() -> dict:
    return {"type": "http.disconnect"}


async def test_a_client_gone_before_the_first_event_still_closes_the_response():
    events, closed = Events(), []

    async def send(message: dict) -> None:
        raise OSError("the client went away")  # the connection is gone at the first write

    response = EventStream(events(), on_close=lambda: closed.append(True))
    with pytest.raises(ClientDisconnect):  # Starlette's name for the failed write
        await response(SCOPE, gone, send)
    assert closed == [True]
    assert not events.finally_ran  # what the generator's own `finally` could not do


async def test_a_cancelled_request_task_closes_the_response_once():
    events, closed, sent = Events(), [], []

    async def send(message: dict) -> None:
        sent.append(message)

    async def waiting() -> dict:
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    task = asyncio.ensure_future(
        EventStream(events(), on_close=lambda: closed.append(True))(SCOPE, waiting, send)
    )
    for _ in range(500):  # the response has begun: its headers went out
        if sent:
            break
        await asyncio.sleep(0.01)
    assert sent and sent[0]["type"] == "http.response.start"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == [True]


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_a_generated_line_separator_does_not_cut_an_event_for_a_line_splitting_client(separator):
    content = f"one{separator}two \u2019quoted\u2019 — é"
    event = b"data: " + orjson.dumps({"choices": [{"delta": {"content": content}}]}) + b"\n\n"

    lines = httpx.Response(200, content=line_safe(event)).iter_lines()

    data = [line for line in lines if line]
    assert len(data) == 1
    assert orjson.loads(data[0].removeprefix("data: "))["choices"][0]["delta"]["content"] == content


def test_events_without_a_separator_are_relayed_as_they_are():
    event = 'data: {"content": "caf\u00e9 \u2014 \u201cok\u201d"}\n\n'.encode()
    assert line_safe(event) == event
