"""One record per request: what the route learned about it, turned into metrics and a log line.

`ObservedRequests` (pure ASGI middleware) opens the record when a request arrives and closes
it after the last byte of the response was sent, stream included. The route and the auth
dependency fill it in through `record_of(request)`; nothing else on the request path changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.observability import access_log
from app.observability import metrics as m
from app.observability.request_id import HEADER, is_sane, new_request_id

CLIENT_CLOSED = 499
"""Status of a stream whose client went away before it ended (nginx's convention)."""

UNOBSERVED_PATHS = frozenset({"/health", "/ready"})
"""Probes: polled every few seconds by load balancers, they would drown the access log."""


@dataclass(slots=True)
class RequestRecord:
    """What is known about one request; times are `time.perf_counter()` values."""

    request_id: str
    started: float
    in_flight: m.InFlight
    model_type: str | None = None
    key_id: str | None = None
    stream: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_token_at: float | None = None
    stream_status: int | None = None
    sent: bool = False
    _waiting: bool = False
    _streaming: bool = False

    def sent_to(self, model_type: str, stream: bool) -> None:
        """The request went to a model type and waits for its first token."""
        self.model_type = model_type
        self.stream = stream
        self.sent = True
        self.in_flight.waiting[model_type] += 1
        self._waiting = True

    @property
    def _sent_to(self) -> str:
        """The model type a request counted in flight went to (set by `sent_to`)."""
        return self.model_type or ""

    def first_token(self) -> None:
        """A stream's first token arrived (events before it, such as a Responses stream's
        `response.created`, do not count)."""
        self.first_token_at = time.perf_counter()
        self._stop_waiting()
        self.in_flight.streaming[self._sent_to] += 1
        self._streaming = True

    def completed(self, prompt_tokens: int, completion_tokens: int) -> None:
        """A whole reply arrived."""
        self.counted(prompt_tokens, completion_tokens)
        self._stop_waiting()

    def counted(self, prompt_tokens: int, completion_tokens: int) -> None:
        """What the request was charged: the tokens its metrics and access line count."""
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens

    def stream_ended(self, error_status: int | None) -> None:
        """The stream's last event was written; `error_status` when that was an error event."""
        self.stream_status = error_status or 200

    def status(self, http_status: int) -> int:
        """The outcome: the HTTP status, or for a stream that began, how the stream ended."""
        if not self.stream or http_status != 200:
            return http_status
        return self.stream_status or CLIENT_CLOSED

    def release(self) -> None:
        """Leave the in-flight counts, whatever point the request reached."""
        self._stop_waiting()
        if self._streaming:
            self.in_flight.streaming[self._sent_to] -= 1
            self._streaming = False

    def _stop_waiting(self) -> None:
        if self._waiting:
            self.in_flight.waiting[self._sent_to] -= 1
            self._waiting = False


def record_of(request: Request) -> RequestRecord:
    """The record of this request (every route but the probes has one)."""
    return request.scope["state"]["record"]


class ObservedRequests:
    """Pure ASGI middleware (no extra task or await per request, streams pass through as-is)."""

    def __init__(self, app: ASGIApp, in_flight: m.InFlight) -> None:
        self._app = app
        self._in_flight = in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNOBSERVED_PATHS:
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = MutableHeaders(scope=scope)
        request_id = headers.get(HEADER)
        # Under Ray Serve every request has a sane id by now, echoed by Ray; without Ray
        # (in-process tests) this is where it gets one, and the response its header.
        echo = request_id is None
        if request_id is None or not is_sane(request_id):
            request_id = headers[HEADER] = new_request_id()
        record = RequestRecord(request_id, started, self._in_flight)
        scope.setdefault("state", {})["record"] = record
        http_status = 500

        async def observed_send(message: Message) -> None:
            nonlocal http_status
            if message["type"] == "http.response.start":
                http_status = message["status"]
                if echo:
                    MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        try:
            await self._app(scope, receive, observed_send)
        finally:
            record.release()
            _account(record, scope, record.status(http_status), time.perf_counter())


def _account(record: RequestRecord, scope: Scope, status: int, ended: float) -> None:
    route = getattr(scope.get("route"), "path", "unmatched")
    model_type = record.model_type or m.NO_MODEL
    duration_s = ended - record.started
    ttft_s = None if record.first_token_at is None else record.first_token_at - record.started
    m.REQUESTS.inc(1, {"route": route, "model_type": model_type, "status": str(status)})
    if record.sent:
        tags = {"model_type": model_type}
        m.REQUEST_DURATION.observe(duration_s, tags)
        if ttft_s is not None:
            m.TIME_TO_FIRST_TOKEN.observe(ttft_s, tags)
        if record.prompt_tokens:
            m.PROMPT_TOKENS.inc(record.prompt_tokens, tags)
        if record.completion_tokens:
            m.COMPLETION_TOKENS.inc(record.completion_tokens, tags)
    access_log.write(
        request_id=record.request_id,
        method=scope["method"],
        route=route,
        model_type=record.model_type,
        status=status,
        stream=record.stream,
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        ttft_ms=None if ttft_s is None else round(ttft_s * 1000, 1),
        duration_ms=round(duration_s * 1000, 1),
        key_id=record.key_id,
    )
