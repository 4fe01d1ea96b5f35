"""vLLM's own OpenAI serving layer over one AsyncLLM: request bodies in, encoded replies out.

The only module that imports vLLM. `OpenAIServingChat` / `OpenAIServingCompletion` (built by
vLLM's `init_app_state`, as Ray Serve LLM builds them inside its replicas) render the chat
template, apply the model's generation_config defaults, run structured outputs, tool-call and
reasoning parsers, and encode the JSON and SSE bytes. This adapter adds what the gateway needs:
the engine's real token counts beside every reply, errors as `GenerationError`s, and streamed
events batched into one message per read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import logging
import os
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.datastructures import State
from vllm.config import StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.cli_args import FrontendArgs
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import VLLMClientError, VLLMServerError
from vllm.renderers.inputs.preprocess import extract_prompt_len
from vllm.sampling_params import RequestOutputKind
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

from deployments.generation import (
    EngineUnavailable,
    GenerationError,
    InvalidGenerationRequest,
    ModelInfo,
    ReplyPart,
)

logger = logging.getLogger("ray.serve.serviceai")  # into the replica's Serve log

_STREAM_ERROR = 'data: {"error"'
PROGRESS_S = 1.0
"""How often a whole reply's counts so far go to the ingress while the engine works on it."""
MAX_PART_BYTES = 1 << 20
"""A whole body larger than this goes in several parts: a Ray message carries at most 4 MiB
(n: 8 with top_logprobs reaches that)."""
_PROMPT_PARAMS = frozenset({"input_tokens", "input_text"})
TEMPLATE_PROBE: dict[str, Any] = {
    "messages": [{"role": "user", "content": ""}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "none",  # the tools are rendered all the same; no parser needed
}
"""A conversation with no text of its own: its tokens are what the chat template adds by
itself (a default system prompt, the tool-calling preamble, the generation prompt)."""
# xgrammar prefixes its errors with a time and a source position: "[00:50:03] <path>:4944: ".
_GRAMMAR_LOG_PREFIX = re.compile(r"\[\d{2}:\d{2}:\d{2}\] <path>:\d+: ")


class TokenCount:
    """Prompt and generated tokens of one API request, as the engine's outputs pass."""

    __slots__ = ("prompt", "completion")

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0


_counting: contextvars.ContextVar[TokenCount] = contextvars.ContextVar("serviceai_tokens")


class WholeReply:
    """A whole reply's one await of the serving layer, run as a task so that the request's
    token counts so far can go to the ingress meanwhile (what a client who leaves pays)."""

    def __init__(self, call: Awaitable[Any], count: TokenCount) -> None:
        self._task = asyncio.ensure_future(call)
        self._count = count

    async def progress(self) -> AsyncIterator[tuple[int, int]]:
        """(prompt, completion) tokens so far every PROGRESS_S, once the engine has begun,
        until the call ends."""
        task, count = self._task, self._count
        while not task.done():
            await asyncio.wait((task,), timeout=PROGRESS_S)
            if not task.done() and count.prompt:
                yield count.prompt, count.completion

    def result(self) -> Any:
        return self._task.result()

    def cancel(self) -> None:
        """If it still runs (its caller left): cancelling vLLM's generator aborts the request."""
        if not self._task.done():
            self._task.cancel()


class CountingEngineClient:
    """The AsyncLLM the serving layer sees, with `generate` counting tokens per API request.

    The count lives in a context variable set by the request's handler: every engine request
    the serving layer starts for it (one per prompt of a /v1/completions list) adds to it.
    """

    def __init__(self, engine: AsyncLLM) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, *args: Any,
                       **kwargs: Any) -> AsyncIterator[Any]:
        count = _counting.get(None)
        kind = getattr(sampling_params, "output_kind", None)
        whole = count is not None and kind == RequestOutputKind.FINAL_ONLY
        if whole:
            # vLLM tells of a whole reply's tokens only at its end. Cumulative outputs say how
            # far the engine is at every step (what a client who leaves is charged); the
            # serving layer still gets one output at the end, every choice in it, as FINAL_ONLY
            # would give (which with n > 1 is every child's last output, merged).
            sampling_params.output_kind = kind = RequestOutputKind.CUMULATIVE
        generator = self._engine.generate(prompt, sampling_params, request_id, *args, **kwargs)
        if count is None:
            async for output in generator:
                yield output
            return
        delta = kind == RequestOutputKind.DELTA
        seen: dict[int, int] = {}
        choices: dict[int, Any] = {}
        last = None
        async for output in generator:
            if last is None:
                count.prompt += len(output.prompt_token_ids or ())
            last = output
            for choice in output.outputs:
                tokens = len(choice.token_ids)
                if delta:
                    count.completion += tokens
                else:  # cumulative outputs: add what is new since the last
                    count.completion += tokens - seen.get(choice.index, 0)
                    seen[choice.index] = tokens
                if whole:
                    choices[choice.index] = choice
            if not whole:
                yield output
        if whole and last is not None:
            last.outputs = [choices[i] for i in sorted(choices)]
            yield last


def frontend_args(
    engine_args: AsyncEngineArgs,
    *,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    chat_template: str | None,
    tool_strict_level: str,
) -> argparse.Namespace:
    """The flat namespace vLLM's `init_app_state` reads (as `vllm serve` parses it)."""
    frontend = FrontendArgs(
        enable_auto_tool_choice=tool_call_parser is not None,
        tool_call_parser=tool_call_parser,
        tool_strict_level=tool_strict_level,
        chat_template=chat_template,
        enable_prompt_tokens_details=True,
        disable_uvicorn_access_log=True,
    )
    if isinstance(engine_args.structured_outputs_config, dict):  # as a config file writes it
        engine_args.structured_outputs_config = StructuredOutputsConfig(
            **engine_args.structured_outputs_config
        )
    if reasoning_parser:
        engine_args.reasoning_parser = reasoning_parser
        engine_args.create_structured_outputs_config()
    return argparse.Namespace(**(vars(frontend) | vars(engine_args)))


class VllmEngine:
    """One vLLM engine and its OpenAI serving layer, serving one model type."""

    def __init__(
        self,
        engine: AsyncLLM,
        state: State,
        tool_call_parser: str | None,
        reasoning_parser: str | None,
    ) -> None:
        self._engine = engine
        self._chat = state.openai_serving_chat
        self._completion = state.openai_serving_completion
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        self.max_model_len: int = engine.model_config.max_model_len
        self.template_tokens = 0

    @classmethod
    async def start(
        cls,
        engine_kwargs: dict[str, Any],
        *,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        chat_template: str | None = None,
        tool_strict_level: str = "parameter",
    ) -> VllmEngine:
        """Build the engine and the serving layer; returns once the model is loaded.

        vLLM's engine metrics (vllm:*) go out through Ray's metrics API, beside the ingress's.
        """
        args = AsyncEngineArgs(**_for_this_platform(engine_kwargs))
        namespace = frontend_args(
            args,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            chat_template=chat_template,
            tool_strict_level=tool_strict_level,
        )
        # The defaults `vllm serve` gets (max_num_batched_tokens: 8192 on an H100, not 2048).
        engine = AsyncLLM.from_engine_args(
            args,
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=[RayPrometheusStatLogger],
        )
        state = State()
        client = CountingEngineClient(engine)
        await init_app_state(
            client, state, namespace, supported_tasks=await engine.get_supported_tasks()
        )
        # vLLM's error path reads the uvicorn server its own launcher would have set.
        state.server = argparse.Namespace(should_exit=False)
        served = cls(engine, state, tool_call_parser, reasoning_parser)
        try:
            served.template_tokens = await served.prompt_tokens("chat", TEMPLATE_PROBE)
        except GenerationError as exc:
            # Unknown: the ingress then measures every prompt before admitting it.
            logger.warning("The chat template's own length is unknown (%s)", exc.message)
            served.template_tokens = served.max_model_len
        return served

    async def serve(
        self, api: str, body: dict[str, Any], *, batched: bool = True
    ) -> AsyncIterator[ReplyPart]:
        """A request of `api` ("chat" or "completion"): one part with the whole JSON body,
        or (with `stream`) batches of SSE events; one event per part unless `batched` (a
        feed batches across requests instead)."""
        request, params = _request_of(api, body)
        create = (
            self._chat.create_chat_completion if api == "chat"
            else self._completion.create_completion
        )
        async for part in self._reply(create, request, params, batched, not request.stream):
            yield part

    def info(self, name: str) -> ModelInfo:
        return ModelInfo(
            name,
            self.max_model_len,
            self.tool_call_parser,
            self.reasoning_parser,
            self.template_tokens,
        )

    async def prompt_tokens(self, api: str, body: dict[str, Any]) -> int:
        """The prompt's tokens as the serving layer renders them for generation (the longest
        prompt of a completion request), without generating: raises the `GenerationError`
        generation would, a prompt beyond the context included."""
        request, params = _request_of(api, body)
        try:
            if api == "chat":
                rendered = await self._chat.render_chat_request(request)
            else:
                rendered = await self._completion.render_completion_request(request)
        except (ValueError, VLLMClientError) as exc:
            raise _refusal(self._chat.create_error_response(exc), *params) from None
        except VLLMServerError as exc:
            raise engine_failure(exc) from None
        if isinstance(rendered, ErrorResponse):
            raise _refusal(rendered, *params)
        inputs = rendered[1] if api == "chat" else rendered
        return max(extract_prompt_len(self._engine.model_config, i) for i in inputs)

    async def _reply(
        self,
        create: Callable[[Any], Awaitable[Any]],
        request: Any,
        params: tuple[str, str],
        batched: bool,
        whole: bool,
    ) -> AsyncIterator[ReplyPart]:
        """The parts of a request (see `serve`); a `whole` reply's body comes in its last parts
        (the last one `ended`), after a part with the counts so far (and no data) every
        PROGRESS_S: what the ingress charges if its client leaves, or the call fails, first."""
        count = TokenCount()
        _counting.set(count)
        # A stream's first await returns at once: awaited as it is.
        reply = WholeReply(create(request), count) if whole else None
        try:
            if reply is None:
                result = await create(request)
            else:
                async for prompt, completion in reply.progress():
                    yield ReplyPart(b"", prompt, completion)
                result = reply.result()
        except (ValueError, VLLMClientError) as exc:
            raise _charged(_refusal(self._chat.create_error_response(exc), *params), count) from None
        except VLLMServerError as exc:
            raise _charged(engine_failure(exc), count) from None
        finally:
            if reply is not None:
                reply.cancel()
        if isinstance(result, ErrorResponse):
            raise _charged(_refusal(result, *params), count)
        if not isinstance(result, AsyncIterator):
            data = result.model_dump_json().encode()
            for start in range(0, len(data), MAX_PART_BYTES):
                end = start + MAX_PART_BYTES
                ended = 200 if end >= len(data) else None
                yield ReplyPart(data[start:end], count.prompt, count.completion, ended)
            return
        if not batched:
            events = _marked(result, params)
            try:
                async for event, ended in events:
                    yield ReplyPart(event.encode(), count.prompt, count.completion, ended)
            except GenerationError as error:
                raise _charged(error, count) from None
            finally:  # closing vLLM's generator aborts the engine request
                await events.aclose()
            return
        reader = _EventReader(result, params)
        try:
            while events := await reader.take():
                data = "".join(events).encode()
                yield ReplyPart(data, count.prompt, count.completion, reader.ended)
        except GenerationError as error:
            raise _charged(error, count) from None
        finally:
            await reader.close()

    async def check_health(self) -> None:
        """Raise if the engine core is dead, so that Serve replaces this replica."""
        await self._engine.check_health()

    @property
    def async_llm(self) -> AsyncLLM:
        """The engine itself, for vLLM's own API handlers (deployments.responses)."""
        return self._engine

    def running_requests(self) -> int:
        return self._engine.output_processor.get_num_unfinished_requests()

    def core_pids(self) -> tuple[int, ...]:
        """The engine-core processes this engine started (not found by title: vLLM sets that late)."""
        manager = self._engine.engine_core.resources.engine_manager
        return () if manager is None else tuple(p.pid for p in manager.processes)

    def shutdown(self) -> None:
        self._engine.shutdown()


def _for_this_platform(engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM's CPU build refuses the Ray executor ("current platform cpu does not support ray"):
    its tensor-parallel shards run as local processes instead, on the node where Serve placed
    the replica's STRICT_PACK bundles. Each shard gets its own CPUs (one NUMA node is not
    enough for vLLM's automatic binding)."""
    from vllm.platforms import current_platform

    if engine_kwargs.get("distributed_executor_backend") != "ray" or not current_platform.is_cpu():
        return engine_kwargs
    shards = int(engine_kwargs.get("tensor_parallel_size", 1))
    cpus = sorted(os.sched_getaffinity(0))
    per_shard = [cpus[i::shards] or cpus for i in range(shards)]
    os.environ.setdefault(
        "VLLM_CPU_OMP_THREADS_BIND", "|".join(",".join(map(str, s)) for s in per_shard)
    )
    return {**engine_kwargs, "distributed_executor_backend": "mp"}


def _request_of(api: str, body: dict[str, Any]) -> tuple[Any, tuple[str, str]]:
    """The serving layer's request for `api` ("chat" or "completion"), and the fields its
    errors name: the prompt's, and the schema's."""
    if api == "chat":
        request, prompt_param = _parse(ChatCompletionRequest, body), "messages"
    elif api == "completion":
        request, prompt_param = _parse(CompletionRequest, body), "prompt"
    else:
        raise ValueError(f"unknown api {api!r}")
    return request, (prompt_param, "response_format" if body.get("response_format") else "tools")


def _parse(model: type[Any], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except VLLMClientError as exc:  # raised by vLLM's own validators, past pydantic's wrapping
        error = InvalidGenerationRequest(str(exc))
        error.param = getattr(exc, "parameter", None)
        raise error from None
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith("function"))
        error = InvalidGenerationRequest(
            f"Invalid value for '{param}': {first.get('msg', 'invalid')}." if param
            else f"Invalid request: {first.get('msg', 'invalid')}."
        )
        error.param = param or None
        raise error from None


def engine_failure(exc: VLLMServerError) -> EngineUnavailable:
    """vLLM's server-side failure of a request as a 503 to retry: its engine core died (Serve
    replaces the replica), or the engine ended the request with an error."""
    if isinstance(exc, EngineDeadError):
        return EngineUnavailable("The model engine stopped; the request was not completed.")
    logger.error("The engine failed a request: %r", exc)
    return EngineUnavailable("The model engine failed this request. Retry shortly.")


def _charged(error: GenerationError, count: TokenCount) -> GenerationError:
    """The error, carrying what the engine processed before it (charged by the ingress)."""
    error.prompt_tokens, error.completion_tokens = count.prompt, count.completion
    return error


def _refusal(response: ErrorResponse, prompt_param: str, schema_param: str) -> GenerationError:
    """vLLM's error (an HTTP status in `code`) as the error the ingress answers with.

    vLLM names the prompt `input_tokens` / `input_text` and no field for a schema its grammar
    compiler refused; OpenAI's clients know the field they sent.
    """
    info = response.error
    status = int(info.code) if isinstance(info.code, int) else 500
    if status >= 500:
        logger.error("The serving layer failed a request: %s", info.message)
        return EngineUnavailable("The model engine failed this request. Retry shortly.")
    message = _GRAMMAR_LOG_PREFIX.sub("", info.message)
    error = InvalidGenerationRequest(message)
    error.status = status
    error.param = prompt_param if info.param in _PROMPT_PARAMS else info.param
    if error.param is None and "schema" in message:
        error.param = schema_param
    if "context length" in info.message:
        error.code = "context_length_exceeded"
    return error


async def _marked(
    events: AsyncIterator[str], params: tuple[str, str]
) -> AsyncIterator[tuple[str, int | None]]:
    """The serving layer's SSE events, each with the status the stream ended with on its last.

    vLLM reports a failure inside a stream as an error event. One caused by the request (a
    4xx: a token id out of the vocabulary, say) that comes first is raised instead, so that the
    client gets it as an HTTP status; later, it is relayed in our envelope. An engine failure
    is replaced by ours, which hides the engine's message.
    """
    started, failed = False, None
    try:
        async for event in events:
            if event.startswith(_STREAM_ERROR):
                error = _stream_error(event, params)
                if not started and error.status < 500:
                    raise error
                event, failed = _error_event(error), error.status
            started = True
            yield event, (failed or 200) if event == _DONE_EVENT else None
    except GenerationError:
        raise
    except Exception as exc:  # the serving layer turns most failures into events itself
        logger.error("Stream failed: %r", exc)
        yield _STREAM_FAILED + _DONE_EVENT, EngineUnavailable.status
    finally:
        await events.aclose()


def _stream_error(event: str, params: tuple[str, str]) -> GenerationError:
    """The error of one of the serving layer's error events."""
    try:
        response = ErrorResponse.model_validate_json(event.removeprefix("data: "))
    except ValidationError:
        logger.error("Stream failed in the serving layer: %s", event[:500])
        return EngineUnavailable("The model engine failed while generating. Retry shortly.")
    return _refusal(response, *params)


def _error_event(error: GenerationError) -> str:
    body = {"message": error.message, "type": error.type, "param": error.param,
            "code": error.code}
    return f"data: {json.dumps({'error': body})}\n\n"


class _EventReader:
    """Drains the serving layer's SSE strings from its own task; `take` returns all that arrived.

    When the ingress reads more slowly than the engine produces, one handle message carries
    every event ready since the last: fewer Ray messages per token, never a wait.
    """

    def __init__(self, events: AsyncIterator[str], params: tuple[str, str]) -> None:
        self._events = events
        self._params = params
        self._failure: GenerationError | None = None
        self._buffer: list[str] = []
        self._arrived = asyncio.Event()
        self._ended = False
        self.ended: int | None = None
        """Once the stream's last event is buffered: 200, or the status of its error event."""
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for event, ended in _marked(self._events, self._params):
                self._buffer.append(event)
                if ended is not None:
                    self.ended = ended
                self._arrived.set()
        except GenerationError as error:  # the request's own, before any event
            self._failure = error
        finally:
            self._ended = True
            self._arrived.set()

    async def take(self) -> list[str]:
        """Everything buffered (up to about MAX_PART_BYTES), waiting for the first event if
        none is; [] once ended. Raises the refusal of a request that vLLM refused in its stream's first event."""
        await self._arrived.wait()
        if self._failure is not None:
            raise self._failure
        taken, size = 0, 0
        while taken < len(self._buffer) and (not taken or size < MAX_PART_BYTES):
            size += len(self._buffer[taken])
            taken += 1
        events, self._buffer = self._buffer[:taken], self._buffer[taken:]
        if not self._ended and not self._buffer:
            self._arrived.clear()
        return events

    async def close(self) -> None:
        """Stop reading; closing vLLM's generator aborts the engine request."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        finally:
            await self._events.aclose()


_DONE_EVENT = "data: [DONE]\n\n"
_STREAM_FAILED = (
    'data: {"error": {"message": "The model engine failed while generating. Retry shortly.", '
    '"type": "server_error", "param": null, "code": "model_unavailable"}}\n\n'
)
