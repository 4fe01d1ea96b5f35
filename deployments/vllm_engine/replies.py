"""One request through vLLM's serving layer, whatever its API: the reply as `ReplyPart`s.

Each API a replica serves (chat, completion, responses) is a `ServedApi`: vLLM's request model
for its body, the serving layer's call, how a whole result and a stream's events are encoded.
`serve` does the rest the same way for every API: the engine's token counts beside every part,
a whole reply's counts while the engine works, vLLM's refusals and failures as
`GenerationError`s (raised, for the ingress to frame as its API does), and bodies and event
batches that fit in a Ray message.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncGenerator, Awaitable
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel, ValidationError
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import GenerationError as VLLMGenerationError
from vllm.exceptions import VLLMClientError, VLLMServerError
from vllm.v1.engine.exceptions import EngineDeadError

from deployments.vllm_engine.counting import EngineTokens, WholeReply, count_this_request
from deployments.vllm_engine.grammar_budget import budget_s
from deployments.wire import (
    EndedInEngine,
    EngineFailed,
    GenerationError,
    InvalidGenerationRequest,
    ReplyPart,
)

logger = logging.getLogger("ray.serve.serviceai")  # into the replica's Serve log

MAX_PART_BYTES = 1 << 20
"""A body or batch of events larger than this goes in several parts: a Ray message carries at
most 4 MiB (a whole reply of n 8 with top_logprobs reaches that)."""
_PROMPT_PARAMS = frozenset({"input_tokens", "input_text"})
# xgrammar prefixes its errors with a time and a source position: "[00:50:03] <path>:4944: ".
_GRAMMAR_LOG_PREFIX = re.compile(r"\[\d{2}:\d{2}:\d{2}\] <path>:\d+: ")
ENDED_WITH_ERROR = "Internal server error"
"""vLLM's whole message for a request its engine ended with an error (finish reason "error")."""


class Event(NamedTuple):
    """One encoded server-sent event of a stream; `final`: a responses stream's terminal
    event, held apart for the ingress to store first; `last`: the stream's end."""

    data: bytes
    final: bytes | None = None
    last: bool = False


class ServedApi(Protocol):
    """What differs between the APIs a replica serves."""

    @property
    def request_type(self) -> type[BaseModel]:
        """vLLM's pydantic model of the request."""

    prompt_param: str
    """The field that holds the prompt, as the client names it (vLLM says `input_tokens`)."""

    def create(self, request: Any) -> Awaitable[Any]:
        """The serving layer's call: a whole result, a stream of events, or an ErrorResponse."""

    def create_error_response(self, error: Exception) -> ErrorResponse: ...

    def body(self, result: Any, request: Any) -> bytes:
        """A whole result of `request`, encoded as the client gets it."""

    def events(self, stream: Any, request: Any) -> AsyncGenerator[Event, None]:
        """A stream's events, encoded; an error event of vLLM's is raised as its refusal."""

    async def prompt_tokens(self, request: Any) -> int | ErrorResponse:
        """The request's prompt as the serving layer renders it for generation, in tokens."""

    def schema_param(self, body: dict[str, Any]) -> str:
        """The field a schema that vLLM's grammar compiler refused came from."""


def parse(api: ServedApi, body: dict[str, Any]) -> Any:
    """vLLM's request for `body`; what it refuses is an InvalidGenerationRequest naming the
    field."""
    try:
        return api.request_type.model_validate(body)
    except VLLMClientError as exc:  # raised by vLLM's own validators, past pydantic's wrapping
        error = InvalidGenerationRequest(str(exc))
        error.param = getattr(exc, "parameter", None)
        raise error from None
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith("function"))
        error = InvalidGenerationRequest(
            f"Invalid value for '{param}': {first.get('msg', 'invalid')}."
            if param
            else f"Invalid request: {first.get('msg', 'invalid')}."
        )
        error.param = param or None
        raise error from None


async def serve(
    api: ServedApi, body: dict[str, Any], *, batched: bool = True, grammar: str | None = None
) -> AsyncGenerator[ReplyPart, None]:
    """The parts of one request of `api`.

    A whole reply: its counts so far every PROGRESS_S while the engine works (parts without
    data), then its body, in parts up to the `last` one. A stream: its events, all that
    arrived since the last part in each (one event per part unless `batched`: a feed batches
    across requests instead), the last part `last`. A refusal that comes before any part is
    raised there, so that the client gets it as an HTTP status. `grammar`: the request's field
    whose grammar the engine compiles, named if it could not (`refused_grammar`).
    """
    request = parse(api, body)
    count = count_this_request()

    def failed(error: GenerationError) -> GenerationError:
        return charged(refused_grammar(error, grammar, count), count)

    whole = not getattr(request, "stream", False)
    # A stream's first await returns at once: awaited as it is.
    reply = WholeReply(api.create(request), count) if whole else None
    try:
        if reply is None:
            result = await api.create(request)
        else:
            async for prompt, completion in reply.progress():
                yield ReplyPart(b"", prompt, completion)
            result = reply.result()
    except (ValueError, VLLMClientError) as exc:
        raise charged(refusal(api.create_error_response(exc), api, body), count) from None
    except VLLMServerError as exc:
        raise failed(engine_failure(exc)) from None
    finally:
        if reply is not None:
            reply.cancel()
    if isinstance(result, ErrorResponse):
        raise failed(refusal(result, api, body))
    if whole:
        data = api.body(result, request)
        for start in range(0, len(data), MAX_PART_BYTES):
            end = start + MAX_PART_BYTES
            yield ReplyPart(data[start:end], count.prompt, count.completion, end >= len(data))
        return
    encoded = api.events(result, request)
    events = EventBatcher(encoded) if batched else _one_by_one(encoded)
    try:
        async for data, final, last in events:
            yield ReplyPart(data, count.prompt, count.completion, last, final)
    except GenerationError as error:
        raise failed(error) from None
    finally:  # closing vLLM's generator aborts the engine request
        await events.aclose()


async def prompt_tokens(api: ServedApi, body: dict[str, Any]) -> int:
    """The prompt's length as generation would render it, nothing generated; what generation
    would refuse (a prompt beyond the context, say) is raised as its GenerationError."""
    request = parse(api, body)
    try:
        tokens = await api.prompt_tokens(request)
    except (ValueError, VLLMClientError) as exc:
        raise refusal(api.create_error_response(exc), api, body) from None
    except VLLMServerError as exc:
        raise engine_failure(exc) from None
    if isinstance(tokens, ErrorResponse):
        raise refusal(tokens, api, body)
    return tokens


class FieldNames(Protocol):
    """How an API names the fields vLLM's refusals leave unnamed."""

    @property
    def prompt_param(self) -> str: ...

    def schema_param(self, body: dict[str, Any]) -> str: ...


def refusal(response: ErrorResponse, api: FieldNames, body: dict[str, Any]) -> GenerationError:
    """vLLM's error (an HTTP status in `code`) as the error the ingress answers with.

    vLLM names the prompt `input_tokens` / `input_text` and no field for a schema its grammar
    compiler refused; OpenAI's clients know the field they sent.
    """
    info = response.error
    status = int(info.code) if isinstance(info.code, int) else 500
    if status >= 500:
        logger.error("The serving layer failed a request: %s", info.message)
        if info.message == ENDED_WITH_ERROR:
            return EndedInEngine("The model engine failed this request. Retry shortly.")
        return EngineFailed("The model engine failed this request. Retry shortly.")
    message = _GRAMMAR_LOG_PREFIX.sub("", info.message)
    error = InvalidGenerationRequest(message)
    error.status = status
    error.param = api.prompt_param if info.param in _PROMPT_PARAMS else info.param
    if error.param is None and "schema" in message:
        error.param = api.schema_param(body)
    if "context length" in message or "max_model_len" in message:
        error.code = "context_length_exceeded"
        error.param = error.param or api.prompt_param
    return error


def engine_failure(exc: VLLMServerError) -> EngineFailed:
    """vLLM's server-side failure of a request as a 503 to retry: its engine core died (Serve
    replaces the replica), or the engine ended the request with an error."""
    if isinstance(exc, EngineDeadError):
        return EngineFailed("The model engine stopped; the request was not completed.")
    logger.error("The engine failed a request: %r", exc)
    if type(exc) is VLLMGenerationError:
        return EndedInEngine("The model engine failed this request. Retry shortly.")
    return EngineFailed("The model engine failed this request. Retry shortly.")


def refused_grammar(
    error: GenerationError, grammar: str | None, count: EngineTokens
) -> GenerationError:
    """`error`, or a 400 naming `grammar` when it is the engine's end of a request whose
    grammar it could not compile (past its budget, deployments.vllm_engine.grammar_budget,
    or refused): vLLM carries no reason from the engine core, only that the request ended in
    error before its first token. In this service's engines (no KV or encoder connector)
    nothing else ends a request so."""
    if grammar is None or count.completion or not isinstance(error, EndedInEngine):
        return error
    refused = InvalidGenerationRequest(
        f"The engine could not compile {grammar} into a grammar within its budget of "
        f"{budget_s():g} s. Simplify it (fewer values or levels, shorter patterns)."
    )
    refused.code = "grammar_too_complex"
    refused.param = grammar
    return refused


def stream_failure(exc: Exception) -> GenerationError:
    """What a stream that raised `exc` (not a refusal of vLLM's) tells the client."""
    if isinstance(exc, GenerationError):
        return exc
    if isinstance(exc, VLLMServerError):
        return engine_failure(exc)
    logger.error("A stream failed: %r", exc)
    return EngineFailed("The model engine failed while generating. Retry shortly.")


def stream_error(message: str) -> GenerationError:
    """A failure vLLM reported inside a stream, by its message, as the failure it is."""
    if message == ENDED_WITH_ERROR:
        return EndedInEngine("The model engine failed this request. Retry shortly.")
    return stream_failure(RuntimeError(message))


def charged(error: GenerationError, count: EngineTokens) -> GenerationError:
    """The error, carrying what the engine processed before it (charged by the ingress)."""
    error.prompt_tokens, error.completion_tokens = count.prompt, count.completion
    return error


async def _one_by_one(events: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
    try:
        async for event in events:
            yield event
    except GenerationError:
        raise
    except Exception as exc:
        raise stream_failure(exc) from None
    finally:
        await events.aclose()


class EventBatcher:
    """Reads a stream's events in a task of its own; each step returns all that arrived.

    When the ingress reads more slowly than the engine produces, one handle message carries
    every event ready since the last (up to MAX_PART_BYTES): fewer Ray messages per token,
    never a wait. A failure is raised after the events that came before it.
    """

    def __init__(self, events: AsyncGenerator[Event, None]) -> None:
        self._events = events
        self._buffer: list[Event] = []
        self._failure: GenerationError | None = None
        self._arrived = asyncio.Event()
        self._ended = False
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for event in self._events:
                self._buffer.append(event)
                self._arrived.set()
        except Exception as exc:
            self._failure = stream_failure(exc)
        finally:
            self._ended = True
            self._arrived.set()

    def __aiter__(self) -> EventBatcher:
        return self

    async def __anext__(self) -> Event:
        """Every event buffered (up to about MAX_PART_BYTES) as one, waiting for the first if
        none is; the failure once nothing comes before it."""
        await self._arrived.wait()
        buffer = self._buffer
        if not buffer:
            if self._failure is not None:
                raise self._failure
            raise StopAsyncIteration
        taken, size = 0, 0
        while taken < len(buffer) and (not taken or size < MAX_PART_BYTES):
            size += len(buffer[taken].data)
            taken += 1
        events, self._buffer = buffer[:taken], buffer[taken:]
        if not self._ended and not self._buffer:
            self._arrived.clear()
        last = events[-1]
        return Event(b"".join(e.data for e in events), last.final, last.last)

    async def aclose(self) -> None:
        """Stop reading; closing vLLM's generator aborts the engine request."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        finally:
            await self._events.aclose()
