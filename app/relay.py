"""One request through the gateway to a model type and its reply back, encoded once.

Checks what can be decided here (fields, context, the plan, a long prompt's length as a
replica measures it) before any counter is touched, admits the request against the plan's
limits, dispatches it, and relays the replica's bytes: the JSON body, or the SSE events batched
as the replica sent them. Usage and limits are charged with the engine's token counts that
travel beside those bytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from fastapi import Request, Response
from ray.serve.handle import DeploymentResponseGenerator

from app.auth import Caller
from app.dispatch import ModelEndpoint, ModelRouter
from app.errors import ApiError
from app.feeds import StreamParts
from app.observability.request_record import RequestRecord, record_of
from app.protocol import ChatCompletionRequest, CompletionRequest, GenerationFields
from app.ratelimit import Admission, RateLimits
from app.sse import DONE_EVENT, EventStream, error_event
from deployments.generation import ModelInfo, ReplyPart

SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
PROMPT_BYTES_BOUND = 2
"""Most tokens a rendered prompt may have per byte of its request body (check_prompt_length)."""
PartStream = DeploymentResponseGenerator | StreamParts
"""A stream's parts after its first: from its own call, or from a feed (app.feeds)."""
Settle = Callable[[int, int], None]
"""Charges the engine's usage (prompt, completion tokens) to the caller's limits and meter."""


class Counted(Protocol):
    """A part of a reply from a replica: the engine's token counts for the request so far."""

    prompt_tokens: int
    completion_tokens: int


async def relay(
    request: Request, caller: Caller, body: GenerationFields, api: str, reply_tokens: int | None
) -> Response:
    """Serve `body` with the model server's `api` ("chat" or "completion").

    `reply_tokens` is the most the reply may generate, all choices and prompts together
    (None: up to the end of the context).
    """
    models: ModelRouter = request.app.state.models
    endpoint = models.resolve(body.model)
    record = record_of(request)
    record.model_type = endpoint.name  # a 429 below is counted against the type it asked for
    refused = body.unsupported_field()
    if refused is not None:
        name, reason = refused
        raise ApiError(400, reason, param=name, code="unsupported_parameter")
    model = await endpoint.info()
    check_against_model(body, model)
    limits: RateLimits = request.app.state.limits
    limits.check_fits(caller, endpoint.name, reply_tokens)
    payload = body.to_engine()
    await check_prompt_length(request, caller, endpoint, model, api, payload)
    admission = await limits.admit(caller, endpoint.name, reply_tokens, choices=_choices(body))
    record.sent_to(endpoint.name, bool(body.stream))

    def done(prompt_tokens: int, completion_tokens: int) -> None:
        """The engine's real usage, charged to the rate limits and metered for the key."""
        admission.settle(prompt_tokens, completion_tokens)
        request.app.state.usage.record(
            caller.key_id, endpoint.name, prompt_tokens, completion_tokens
        )

    longest = admission.reply_length(model.max_model_len)
    if body.reply_limit is None and longest is not None:
        payload[_reply_field(body)] = longest
    with charged_on_failure(admission, done):
        if body.stream:
            first, stream = await endpoint.open_stream(api, payload)
        else:
            whole = await endpoint.reply(api, payload)

    if body.stream:
        record.first_token(first.prompt_tokens)
        tally = Tally(first)
        events = _events(endpoint, stream, tally, record)
        return event_stream(events, tally, stream, admission, done)
    done(whole.prompt_tokens, whole.completion_tokens)
    record.completed(whole.prompt_tokens, whole.completion_tokens)
    return Response(whole.data, media_type="application/json", headers=admission.headers)


@contextmanager
def charged_on_failure(admission: Admission, settle: Settle) -> Iterator[None]:
    """A dispatch that fails, or whose client leaves, is charged what the engine processed
    before (the error's `engine_usage`), to the limits and the key's usage, if anything; its
    error carries the plan's rate-limit headers."""
    try:
        yield
    except BaseException as error:
        usage = getattr(error, "engine_usage", (0, 0))
        if any(usage):
            settle(*usage)
        else:
            admission.settle(0, 0)
        if isinstance(error, ApiError):
            error.headers.update(admission.headers)
        raise


def event_stream(
    events: AsyncIterator[bytes],
    tally: Tally,
    stream: PartStream,
    admission: Admission,
    settle: Settle,
) -> EventStream:
    """The SSE response relaying `events`; charged (and the engine freed) when it closes."""
    return EventStream(
        events,
        media_type="text/event-stream",
        headers={**SSE_HEADERS, **admission.headers},
        on_close=tally.on_close(stream, settle),
    )


def check_against_model(body: GenerationFields, model: ModelInfo) -> None:
    """Refuse what this model type can never serve, before any rate-limit counter moves."""
    limit = body.reply_limit
    if limit is not None and limit >= model.max_model_len:
        param = (
            "max_completion_tokens"
            if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None
            else "max_tokens"
        )
        raise ApiError(
            400,
            f"{param} is too large: {limit}. This model's maximum context length is "
            f"{model.max_model_len} tokens, prompt included; request fewer completion tokens.",
            param=param,
            code="context_length_exceeded",
        )
    if not isinstance(body, ChatCompletionRequest):
        return
    if body.tools and body.tool_choice != "none" and model.tool_call_parser is None:
        # vLLM needs the parser for 'required' and named choices too: it frames calls with it.
        raise ApiError(
            400,
            f"{model.name} has no tool-call parser, so it cannot call tools: tool_choice "
            f"'{_choice_name(body.tool_choice)}' is not supported on it (only 'none'). "
            "Use a model type that parses tool calls.",
            param="tool_choice",
            code="unsupported_parameter",
        )
    if body.reasoning_effort is not None and model.reasoning_parser is None:
        raise ApiError(
            400,
            f"{model.name} does not reason before answering: reasoning_effort is not supported.",
            param="reasoning_effort",
            code="unsupported_parameter",
        )


async def check_prompt_length(
    request: Request,
    caller: Caller,
    endpoint: ModelEndpoint,
    model: ModelInfo,
    api: str,
    payload: dict,
) -> None:
    """Refuse a prompt beyond the model's context before any rate-limit counter moves.

    Only a replica's tokenizer knows a prompt's length, so only a body that may hold one that
    long is measured there (rendered as for generation, nothing generated): a token covers at
    least one byte of what the template renders, and a template's JSON of the tools adds at
    most a byte per byte of the body's, so a body of `n` bytes renders to fewer than
    `PROMPT_BYTES_BOUND * n` tokens plus the template's own. A shorter body goes straight on,
    and the replica still checks every prompt it generates for. The refusal counts against
    the caller's request rate as any refused body does (a replica rendered it); a caller with
    no request left this minute gets admission's 429 without a replica's work.
    """
    size = len(await request.body())
    if PROMPT_BYTES_BOUND * size + model.template_tokens < model.max_model_len:
        return
    limits: RateLimits = request.app.state.limits
    if not await limits.has_requests_left(caller, endpoint.name):
        return
    try:
        await endpoint.prompt_tokens(api, payload)
    except ApiError as error:
        if error.status < 500:
            limits.count_refused(caller, endpoint.name)
        raise


def _choice_name(choice: object) -> str:
    """'auto' for an omitted choice (OpenAI's default when tools are given), else the choice."""
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else "a named function"


class Tally:
    """What a stream has passed on so far (its last part carries the engine's counts so far);
    read when the response closes."""

    __slots__ = ("last", "finished")

    def __init__(self, first: Counted) -> None:
        self.last = first
        self.finished = False

    def finish(self, record: RequestRecord, status: int) -> None:
        """The stream is complete (200) or ended with an error event of `status`."""
        self.finished = True
        record.stream_ended(self.last.completion_tokens, None if status == 200 else status)

    def on_close(self, stream: PartStream, settle: Settle) -> Callable[[], None]:
        """What runs when the response ends, however it ends (before its first event too)."""

        def closed() -> None:
            if not self.finished:
                # The client went away: free the engine at once rather than generate for nobody.
                stream.cancel()
            # Whatever the engine produced counts, a stream the client cut off included.
            settle(self.last.prompt_tokens, self.last.completion_tokens)

        return closed


def _choices(body: GenerationFields) -> int:
    """The replies the engine makes for `body`: choices, times prompts for /v1/completions."""
    if isinstance(body, CompletionRequest):
        return max(body.choices, body.best_of or 1) * body.prompts
    return body.choices


def _reply_field(body: GenerationFields) -> str:
    """The field that limits each reply's length, as vLLM reads it for this API."""
    return "max_completion_tokens" if isinstance(body, ChatCompletionRequest) else "max_tokens"


async def _events(
    endpoint: ModelEndpoint,
    stream: PartStream,
    tally: Tally,
    record: RequestRecord,
) -> AsyncIterator[bytes]:
    error_status = None
    try:
        part = tally.last
        while True:
            if part.ended is not None:
                # Complete before its last events are written: the client may hang up on them.
                tally.finish(record, part.ended)
            yield part.data
            if tally.finished:
                return
            part = tally.last = await anext(stream)
    except StopAsyncIteration:
        pass  # ended without its end mark: complete all the same
    except Exception as exc:
        error = endpoint.error(exc)
        error_status = error.status
        yield error_event(error.body()) + DONE_EVENT
    tally.finish(record, error_status or 200)
