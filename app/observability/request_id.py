"""The id of a request: the client's `x-request-id` when it is sane, else a new one.

Ray Serve (HAProxy and the replica's HTTP server) already gives every request an
`x-request-id`, echoes it on the response and puts it in every Serve log line of that request.
It takes the client's value verbatim, though; this middleware runs before Ray's own
(`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`, see app/serving/ray_runtime.py) and replaces a value
that is too long or carries characters a log reader would trip over.
"""

from __future__ import annotations

import re
import uuid

from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

HEADER = "x-request-id"
MAX_LENGTH = 128
_SANE = re.compile(rf"[A-Za-z0-9._:@/+=-]{{1,{MAX_LENGTH}}}")


def is_sane(request_id: str) -> bool:
    return _SANE.fullmatch(request_id) is not None


def new_request_id() -> str:
    return str(uuid.uuid4())


class SaneRequestId:
    """Pure ASGI middleware: an insane `x-request-id` is replaced before anything reads it."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = MutableHeaders(scope=scope)
            given = headers.get(HEADER)
            if given is not None and not is_sane(given):
                headers[HEADER] = new_request_id()
        await self._app(scope, receive, send)


def http_middlewares() -> list[Middleware]:
    """Ray Serve's HTTP callback: middlewares it puts in front of its own request-id one."""
    return [Middleware(SaneRequestId)]
