"""The SSE response settles a request however it ends, even before its first event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.requests import ClientDisconnect

from app.openai.sse import EventStream

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
