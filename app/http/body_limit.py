"""A cap on the size of request bodies, and on the time they take, enforced while they are read.

A declared `Content-Length` over the cap is refused before any byte of the body is read; a
body without one (chunked) is counted as it arrives and cut off at the cap. Either way the
client gets a 413 in the OpenAI envelope, and the application never holds more than the cap.
A body still arriving `read_timeout_s` after the application first asked for it is cut off
with a 408: a client sending a byte a second holds nothing for long.
"""

from __future__ import annotations

import asyncio

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.openai.errors import error_body

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_BODY_READ_TIMEOUT_S = 30.0


def too_slow_body(read_timeout_s: float) -> bytes:
    return orjson.dumps(
        error_body(
            f"The request body did not arrive within {read_timeout_s:g} s. "
            "Send it at once, or over a faster connection.",
            "invalid_request_error",
            code="request_timeout",
        )
    )


def too_large_body(max_body_bytes: int) -> bytes:
    return orjson.dumps(
        error_body(
            f"The request body is larger than the limit of {max_body_bytes} bytes "
            f"({max_body_bytes / 2**20:g} MiB). Send a shorter conversation.",
            "invalid_request_error",
            code="request_too_large",
        )
    )


class BodyLimit:
    """ASGI middleware: 413 for a request body over `max_body_bytes`, 408 for one that takes
    longer than `read_timeout_s` to arrive."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s
        self._refusals = {
            413: too_large_body(max_body_bytes), 408: too_slow_body(read_timeout_s)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_body_bytes:
            await self._refuse(send, 413)
            return
        received = 0
        over: int | None = None  # the status that cut the body off
        refused = False
        deadline: float | None = None
        body_done = False

        async def counted_receive() -> Message:
            nonlocal received, over, deadline, body_done
            if over:
                return {"type": "http.disconnect"}
            if body_done:  # past the body only a disconnect can come: no deadline on it
                return await receive()
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.read_timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                # Stop the app reading here; whatever it answers is replaced by the 408.
                over = 408
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.max_body_bytes:
                    over = 413
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal refused
            if not over:
                await send(message)
            elif not refused and message["type"] == "http.response.start":
                refused = True
                await self._refuse(send, over)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not refused:
            await self._refuse(send, over)

    async def _refuse(self, send: Send, status: int) -> None:
        refusal = self._refusals[status]
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(refusal)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": refusal})


def _declared_length(scope: Scope) -> int:
    """The largest Content-Length the client declared (a repeated header counts at its worst)."""
    lengths = [v for k, v in scope["headers"] if k.lower() == b"content-length"]
    largest = 0
    for value in lengths:
        try:
            largest = max(largest, int(value))
        except ValueError:
            continue
    return largest
