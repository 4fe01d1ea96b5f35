"""Server-sent events the ingress writes itself: only the error that ends a broken stream.

Every other event comes encoded from the model replica (vLLM's serving layer) and is relayed
as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE_EVENT = b"data: [DONE]\n\n"


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
