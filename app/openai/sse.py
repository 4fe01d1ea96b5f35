"""Server-sent events the ingress writes itself: only the error that ends a broken stream.

Every other event comes encoded from the model replica (vLLM's serving layer) and is relayed
as it is, but for the line separators that JSON leaves raw (`line_safe`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE_EVENT = b"data: [DONE]\n\n"
_RAW_SEPARATORS = re.compile(rb"\xe2\x80[\xa8\xa9]|\xc2\x85")  # U+2028, U+2029, U+0085 in UTF-8
_ESCAPED = {b"\xe2\x80\xa8": b"\\u2028", b"\xe2\x80\xa9": b"\\u2029", b"\xc2\x85": b"\\u0085"}


def line_safe(events: bytes) -> bytes:
    """`events` with the line and paragraph separators and NEL escaped inside their JSON strings.

    JSON may carry them raw, and SSE ends lines only at CR and LF; but httpx's `iter_lines`, and
    any client that splits decoded text with `str.splitlines`, ends a line at each and cuts a
    generated event in two. Escaped, the JSON is the same; in UTF-8 JSON these bytes can only be
    these characters inside a string.
    """
    if b"\xe2\x80" not in events and b"\xc2\x85" not in events:
        return events
    return _RAW_SEPARATORS.sub(lambda found: _ESCAPED[found.group()], events)


def error_event(body: dict[str, Any]) -> bytes:
    """An error after the stream began: the client raises on a `data: {"error": ...}` event."""
    return b"data: " + orjson.dumps(body) + b"\n\n"


class EventStream(StreamingResponse):
    """An event stream whose `on_close` runs when the response ends, however it ends: after
    the last event, when the client left (before the first event too, when the generator's
    own `finally` never runs), or when the request's task is cancelled."""

    def __init__(self, *args: Any, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
