"""A cap on the size of request bodies, and on the time they take, enforced while they are read.

A declared `Content-Length` over the cap is refused before the application sees a byte of the
body; a body without one (chunked) is counted as it arrives and cut off at the cap. Either way the
client gets a 413 in its API's envelope (OpenAI's; Anthropic's under /v1/messages), and the
application never holds more than the cap.
A body still arriving `read_timeout_s` after the application first asked for it is cut off
with a 408: a client sending a byte a second holds nothing for long.

Any answer given before the body has all arrived (these refusals, a stranger's 401) goes out at
once, and then the rest of the body is read and dropped before the response ends: closing a
connection with unread bytes in it sends a reset, and a reset can cut the answer off on its way
(HAProxy in front of the ingress then passes on a truncated reply or none). What is dropped stays
within the same read deadline and `DRAIN_FACTOR` times the cap; past those the connection is
closed as it stands.
"""

from __future__ import annotations

import asyncio

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.anthropic import envelope
from app.openai.errors import error_body

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_BODY_READ_TIMEOUT_S = 30.0
# A body refused for its size is read to its end and dropped up to this many times the cap.
DRAIN_FACTOR = 8
_DISCONNECT: Message = {"type": "http.disconnect"}


def too_slow_body(read_timeout_s: float, anthropic: bool = False) -> bytes:
    message = (
        f"The request body did not arrive within {read_timeout_s:g} s. "
        "Send it at once, or over a faster connection."
    )
    return _refusal(408, message, "request_timeout", anthropic)


def too_large_body(max_body_bytes: int, anthropic: bool = False) -> bytes:
    message = (
        f"The request body is larger than the limit of {max_body_bytes} bytes "
        f"({max_body_bytes / 2**20:g} MiB). Send a shorter conversation."
    )
    return _refusal(413, message, "request_too_large", anthropic)


def _refusal(status: int, message: str, code: str, anthropic: bool) -> bytes:
    """The body of an early refusal in its API's envelope: Anthropic's under /v1/messages."""
    if anthropic:
        return orjson.dumps(envelope.error_body(status, message))
    return orjson.dumps(error_body(message, "invalid_request_error", code=code))


class RequestBody:
    """One request's body as it arrives: counted, read under a deadline, cut off at the cap."""

    def __init__(
        self, scope: Scope, receive: Receive, max_bytes: int, read_timeout_s: float
    ) -> None:
        self._receive = receive
        self.scope = scope
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s
        self.declared, chunked, self._awaits_continue = _framing(scope["headers"])
        self.received = 0
        self.done = self.declared == 0 and not chunked  # nothing (more) to come
        self.gone = False  # the client disconnected
        self.over: int | None = None  # the status that cut the body off: 413 or 408
        self._deadline: float | None = None

    async def receive(self) -> Message:
        """The application's `receive`: a disconnect once the body is cut off."""
        if self.over:
            return _DISCONNECT
        if self.done:  # past the body only a disconnect can come: no deadline on it
            return await self._receive()
        try:
            message = await self._next()
        except TimeoutError:
            # Stop the app reading here; whatever it answers is replaced by the 408.
            self.over = 408
            return _DISCONNECT
        if self.received > self.max_bytes:
            self.over = 413
            return _DISCONNECT
        return message

    async def drop_rest(self) -> None:
        """Read what is left of the body and drop it, so that the connection closes without a
        reset: not for a body too slow to wait for, one far over the cap, or one the client
        has not begun to send (it waits for `100 Continue`, which this never asks for)."""
        most = DRAIN_FACTOR * self.max_bytes
        if (
            self.done
            or self.gone
            or self.over == 408
            or self.declared > most
            or (self._awaits_continue and self.received == 0)
        ):
            return
        try:
            while not self.done and not self.gone and self.received <= most:
                await self._next()
        except TimeoutError:
            return

    async def _next(self) -> Message:
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().time() + self.read_timeout_s
        async with asyncio.timeout_at(self._deadline):
            message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.done = not message.get("more_body", False)
        else:
            self.gone = True
        return message


class BodyLimit:
    """ASGI middleware: 413 for a request body over `max_body_bytes`, 408 for one that takes
    longer than `read_timeout_s` to arrive; any early answer ends after the body is dropped."""

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
            (413, anthropic): too_large_body(max_body_bytes, anthropic)
            for anthropic in (False, True)
        } | {
            (408, anthropic): too_slow_body(read_timeout_s, anthropic)
            for anthropic in (False, True)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = RequestBody(scope, receive, self.max_body_bytes, self.read_timeout_s)
        if body.declared > self.max_body_bytes:
            body.over = 413
            await self._refuse(send, body, 413)
            return
        refused = False

        async def guarded_send(message: Message) -> None:
            nonlocal refused
            if body.over:
                if not refused and message["type"] == "http.response.start":
                    refused = True
                    await self._refuse(send, body, body.over)
                return
            if (
                message["type"] == "http.response.body"
                and not message.get("more_body", False)
                and not body.done
            ):
                # Answered before the body was read (a stranger's 401): out now, ended after.
                await send({**message, "more_body": True})
                await body.drop_rest()
                await send({"type": "http.response.body", "body": b""})
                return
            await send(message)

        try:
            await self.app(scope, body.receive, guarded_send)
        except Exception:
            if not body.over:
                raise
        if body.over and not refused:
            await self._refuse(send, body, body.over)

    async def _refuse(self, send: Send, body: RequestBody, status: int) -> None:
        path = body.scope.get("path", "").removeprefix(body.scope.get("root_path", ""))
        refusal = self._refusals[status, envelope.speaks_anthropic(path)]
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
        await send({"type": "http.response.body", "body": refusal, "more_body": True})
        await body.drop_rest()
        await send({"type": "http.response.body", "body": b""})


def _framing(headers: list[tuple[bytes, bytes]]) -> tuple[int, bool, bool]:
    """The largest Content-Length declared (a repeated header counts at its worst), whether
    the body is chunked, and whether the client waits for `100 Continue` before sending it."""
    largest, chunked, awaits_continue = 0, False, False
    for key, value in headers:
        key = key.lower()
        if key == b"content-length":
            try:
                largest = max(largest, int(value))
            except ValueError:
                continue
        elif key == b"transfer-encoding":
            chunked = chunked or b"chunked" in value.lower()
        elif key == b"expect":
            awaits_continue = value.lower() == b"100-continue"
    return largest, chunked, awaits_continue
