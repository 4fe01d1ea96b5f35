"""A cap on the size of request bodies, enforced while they are read.

A declared `Content-Length` over the cap is refused before any byte of the body is read; a
body without one (chunked) is counted as it arrives and cut off at the cap. Either way the
client gets a 413 in the OpenAI envelope, and the application never holds more than the cap.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import error_body

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024


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
    """ASGI middleware: 413 for a request body over `max_body_bytes`."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self._refusal = too_large_body(max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_body_bytes:
            await self._refuse(send)
            return
        received = 0
        over = False
        refused = False

        async def counted_receive() -> Message:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    # Stop the app reading here; whatever it answers is replaced by the 413.
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal refused
            if not over:
                await send(message)
            elif not refused and message["type"] == "http.response.start":
                refused = True
                await self._refuse(send)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not refused:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(self._refusal)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": self._refusal})


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
