"""One request through the gateway to a model type and its reply back: every API, one path.

Chat, completions, responses, messages and embeddings take the same steps in the same order:
resolve the model type, refuse what cannot be honoured (by name), check the request against
the model (its API served there, the reply and the prompt against the context, an embedding's
inputs against the plan's bounds), check that the reply can ever fit the plan,
admit it (its ticket sets the plan's cap and priority in the payload), dispatch it, relay
the reply (a whole body, or the replica's events as it batched them), and charge the ticket
once with the engine's token counts, however the request ends (`app.limits.ticket`). An
`ApiCall` supplies only what differs between APIs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from fastapi import Request, Response

from app.accounts.auth import Caller
from app.limits.admission import RateLimits
from app.limits.ticket import Meter, Ticket
from app.observability.request_record import RequestRecord, record_of
from app.openai.errors import ApiError
from app.openai.protocol import ReplyLength
from app.openai.sse import EventStream, line_safe
from app.serving.adapters import adapter_path
from app.serving.checks import (
    InputSize,
    check_api_served,
    check_inputs,
    check_prompt_length,
    check_reply_length,
)
from app.serving.continuation import Continue
from app.serving.dispatch import ModelEndpoint, count_failure
from app.serving.endpoints import ModelEndpoints
from app.serving.migration import ContinuedStream, Failover
from deployments.wire import ADAPTER_PATH, Api, ModelInfo, ReplyPart

SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
KEEPALIVE_S = 10.0
"""A stream of an API with a keep-alive event sends it after this long without a part (a
queue, a long prefill): proxies and clients that time out idle connections keep it."""


class ApiCall(Protocol):
    """One request of an API, as the pipeline serves it: what differs between APIs."""

    api: Api
    model: str
    stream: bool
    background: bool
    """Answered at once, generated after (`in_background`): a Responses option."""
    reply: ReplyLength
    prompt_bytes: int
    """Bytes of the prompt beyond the request's body (a replayed history)."""

    def check_fields(self) -> None:
        """Raise a 400 naming the first field the service cannot honour."""

    def check_against_model(self, model: ModelInfo) -> None:
        """Raise what this model type can never serve (besides the reply's length)."""

    async def prepare(self) -> None:
        """What the body needs from elsewhere before it is measured (a stored history)."""

    def payload(self) -> dict:
        """The body the model replica gets."""

    async def whole(self, data: bytes) -> bytes:
        """A whole reply's body (as the replica encoded it) as the client gets it."""

    async def events(self, part: ReplyPart) -> bytes:
        """The bytes of a stream's part, as the client gets them."""

    def error_event(self, error: ApiError) -> bytes:
        """The event that ends a stream with `error`."""

    def resume(self, payload: dict, model: ModelInfo) -> Continue:
        """How a stream cut by a failed replica goes on (the API's continuation rules:
        app/apis/<api>/continuation.py), or why it cannot."""

    async def in_background(self, failover: Failover, ticket: Ticket) -> Response:
        """Where `background` is set: the answer now, the reply generated after."""

    keepalive: bytes | None
    """The event a stream sends while it waits (Anthropic's `ping`), or None."""
    inputs: InputSize | None
    """An embedding request's inputs, held to the plan's bounds (check_inputs); None for an
    API that generates, whose prompt is held to the context (check_prompt_length)."""


async def serve(request: Request, caller: Caller, call: ApiCall) -> Response:
    """Serve one request of any API (see the module's docstring for the steps)."""
    models: ModelEndpoints = request.app.state.models
    limits: RateLimits = request.app.state.limits
    endpoint, adapter = target(models, caller, call.model)
    record = record_of(request)
    record.model_type = endpoint.name  # a 429 below is counted against the type it asked for
    call.check_fields()
    model = await endpoint.info()
    registered_path = await adapter_path(request.app.state.adapters, adapter, model)
    check_api_served(call.api, model)
    check_reply_length(call.reply, model)
    call.check_against_model(model)
    limits.check_fits(caller, endpoint.name, call.reply)
    await call.prepare()
    payload = call.payload()
    # The replica serves the type's name (not an alias), and each adapter as `Type:adapter`.
    payload["model"] = adapter or endpoint.name
    if registered_path is not None:
        payload[ADAPTER_PATH] = registered_path
    if call.inputs is not None:
        await check_inputs(limits, caller, endpoint, model, call.inputs, payload)
    else:
        prompt_bytes = len(await request.body()) + call.prompt_bytes
        await check_prompt_length(limits, caller, endpoint, model, call.api, payload, prompt_bytes)
    ticket = await limits.open(
        caller,
        endpoint.name,
        call.reply,
        model=model,
        usage=request.app.state.usage,
        usage_model=adapter,
    )
    record.sent_to(endpoint.name, call.stream)
    ticket.shape(payload, call.reply, model)
    failover = Failover(endpoint, call.api, payload, request.app.state.migration_attempts)
    if call.background:
        return await call.in_background(failover, ticket)
    async with ticket.charging() as meter:
        if call.stream:
            first, stream = await failover.stream(meter, call.resume(payload, model))
            meter.handed_to_stream()
        else:
            whole = await failover.whole(meter)
            meter.charge()  # written while the body is made; the slot is free before it goes
            record.completed(whole.prompt_tokens, whole.completion_tokens)
            body = await call.whole(whole.data)
    if not call.stream:
        return Response(body, media_type="application/json", headers=ticket.headers)
    tally = Tally(first, meter, record)
    return EventStream(
        _relay(call, endpoint, stream, tally),
        media_type="text/event-stream",
        headers={**SSE_HEADERS, **ticket.headers},
        on_close=tally.on_close(stream),
    )


def target(models: ModelEndpoints, caller: Caller, model: str) -> tuple[ModelEndpoint, str | None]:
    """The endpoint and the LoRA adapter (or None) a request for `model` goes to: 404 for a
    model that does not exist (naming only those the key may call), 403 for one the key may
    not call, 503 for a type with no replica."""
    name = models.get(model, caller.models).name
    adapter = adapter_named(model, name)
    check_allowed(caller, adapter or name)
    return models.resolve(model), adapter


def check_allowed(caller: Caller, model: str) -> None:
    """A key scoped to some model types (or adapters) calls only those: 403 naming them."""
    if not caller.may_call(model):
        allowed = ", ".join(sorted(caller.models or ()))
        raise ApiError(
            403,
            f"This API key may not call {model}; it may call: {allowed}. Use a key "
            "scoped to this model, or ask the key's owner to widen its scope.",
            param="model",
            code="model_not_allowed",
        )


def adapter_named(model: str, model_type: str) -> str | None:
    """The LoRA adapter `model` names (`Type:adapter`, on the type it resolved to), or None."""
    if ":" not in model or model.partition(":")[0] != model_type:
        return None
    return model


class Tally:
    """A stream as it goes: its last part so far, counted on its ticket's meter, which it
    charges once: before the stream's last bytes, or when the response closes. The request's
    record gets the time of its first token and, at the end, what the meter charged."""

    __slots__ = ("last", "finished", "meter", "record", "_tokens")

    def __init__(self, first: ReplyPart, meter: Meter, record: RequestRecord) -> None:
        self.finished = False
        self.meter = meter
        self.record = record
        self._tokens = False
        self.advance(first)

    def advance(self, part: ReplyPart) -> None:
        self.last = part
        self.meter.count(part)
        if not self._tokens and part.completion_tokens:
            self._tokens = True
            self.record.first_token()

    async def finish(self, status: int) -> None:
        """The stream is complete (200) or ends with an error event of `status`: charged,
        and its slot free before the client can read its end and send again."""
        self.finished = True
        self.record.stream_ended(None if status == 200 else status)
        await self.meter.settle()

    def on_close(self, parts: ContinuedStream) -> Callable[[], None]:
        """What runs when the response ends, however it ends (before its first event too)."""

        def closed() -> None:
            if not self.finished:
                # The client went away: free the engine at once rather than generate for nobody.
                parts.cancel()
            # Whatever the engine produced counts, a stream the client cut off included.
            self.meter.charge()
            self.record.counted(self.meter.prompt_tokens, self.meter.completion_tokens)

        return closed


async def _relay(
    call: ApiCall,
    endpoint: ModelEndpoint,
    parts: ContinuedStream,
    tally: Tally,
) -> AsyncIterator[bytes]:
    """The stream's parts as the client gets them; a failure ends it with the API's error
    event. A stream is complete before its last bytes are written: the client may hang up on
    them."""
    try:
        part = tally.last
        while True:
            data = line_safe(await call.events(part))
            if part.last:
                await tally.finish(200)
            yield data
            if tally.finished:
                return
            if call.keepalive is None:
                part = await anext(parts)
            else:
                waiting = asyncio.ensure_future(anext(parts))
                try:
                    while not (await asyncio.wait({waiting}, timeout=KEEPALIVE_S))[0]:
                        yield call.keepalive
                finally:
                    waiting.cancel()  # the client left while it waited
                part = waiting.result()
            tally.advance(part)
    except StopAsyncIteration:
        error = endpoint.error(EOFError("the stream ended without its last part"))
    except ApiError as exc:  # a stream that went on elsewhere, and failed there to begin
        error = exc
    except Exception as exc:
        count_failure(exc, tally.meter)
        error = endpoint.error(exc)
    await tally.finish(error.status)
    yield call.error_event(error)
