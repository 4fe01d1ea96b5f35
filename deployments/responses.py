"""vLLM's own Responses API handler (`OpenAIServingResponses`) over a replica's AsyncLLM.

vLLM renders the input items with the chat template, applies text.format and tool_choice as
structured outputs, parses tool calls and emits OpenAI's stream events. What it must not do
here is keep responses: its store lives in this process's memory (and stays off, as
VLLM_ENABLE_RESPONSES_API_STORE is unset); the gateway sends the whole conversation with
store=false and keeps stored responses in its database. This module adds the engine's real
token counts beside every reply, and sets `store` and `previous_response_id` in the response
objects to what the gateway does with them (`echo`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from vllm.entrypoints.openai.models.protocol import BaseModelPath
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import VLLMClientError, VLLMServerError
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.v1.engine.async_llm import AsyncLLM

from deployments.engine import (
    CountingEngineClient,
    TokenCount,
    WholeReply,
    _counting,
    engine_failure,
)
from deployments.generation import EngineUnavailable, GenerationError, InvalidGenerationRequest
from deployments.responses_wire import TERMINAL_EVENTS, ResponsePart

logger = logging.getLogger("ray.serve.serviceai")  # into the replica's Serve log

# vLLM-only fields of its response object; OpenAI's clients do not know them.
_VLLM_ONLY = {
    "kv_transfer_params", "ec_transfer_params", "input_messages", "output_messages", "metrics",
}


class ResponsesServing:
    """Serves POST /v1/responses for one model type, on the replica's engine."""

    def __init__(self, serving: OpenAIServingResponses, parses_tool_calls: bool) -> None:
        self._serving = serving
        self._parses_tool_calls = parses_tool_calls

    @classmethod
    def build(
        cls, engine: AsyncLLM, served_name: str, tool_call_parser: str | None = None
    ) -> ResponsesServing:
        client = CountingEngineClient(engine)
        model_path = engine.model_config.model
        models = OpenAIServingModels(
            engine_client=client,
            base_model_paths=[BaseModelPath(name=served_name, model_path=model_path)],
        )
        renderer = OnlineRenderer(
            model_config=engine.model_config,
            renderer=engine.renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
            trust_request_chat_template=False,
            trust_request_mm_kwargs=False,
            enable_auto_tools=tool_call_parser is not None,
            exclude_tools_when_tool_choice_none=False,
            tool_parser=tool_call_parser,
            tool_strict_level="auto",
            reasoning_parser=None,
            default_chat_template_kwargs=None,
            log_error_stack=False,
        )
        serving = OpenAIServingResponses(
            client,
            models,
            renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
            enable_auto_tools=tool_call_parser is not None,
            tool_parser=tool_call_parser,
            enable_prompt_tokens_details=True,
        )
        if serving.enable_store:
            raise RuntimeError(
                "VLLM_ENABLE_RESPONSES_API_STORE must be unset: the gateway stores responses."
            )
        return cls(serving, parses_tool_calls=tool_call_parser is not None)

    async def respond(self, body: dict[str, Any], echo: dict[str, Any]) -> AsyncIterator[ResponsePart]:
        """One request: a single part with the whole response, or batches of stream events."""
        if body.get("tools") and body.get("tool_choice") != "none" and not self._parses_tool_calls:
            # Without a parser vLLM would answer with text: refuse rather than ignore the tools.
            error = InvalidGenerationRequest(
                f"{body.get('model')} has no tool-call parser configured, so it cannot call "
                "function tools. Send no tools (or tool_choice 'none'), or use another model."
            )
            error.param = "tools"
            raise error
        request = _parse(body)
        count = TokenCount()
        _counting.set(count)
        # A whole reply: its counts so far, every second or so, in parts without events or
        # final, then the response (what the ingress charges if its client leaves first).
        reply = None
        if not request.stream:
            reply = WholeReply(self._serving.create_responses(request), count)
        try:
            if reply is None:
                result = await self._serving.create_responses(request)
            else:
                async for prompt, completion in reply.progress():
                    yield ResponsePart(b"", None, prompt, completion)
                result = reply.result()
        except (ValueError, VLLMClientError) as exc:
            raise _refusal(self._serving.create_error_response(exc)) from None
        except VLLMServerError as exc:
            raise engine_failure(exc) from None
        finally:
            if reply is not None:
                reply.cancel()
        if isinstance(result, ErrorResponse):
            raise _refusal(result)
        if isinstance(result, ResponsesResponse):
            yield ResponsePart(b"", _response_json(result, echo), count.prompt, count.completion)
            return
        async for part in _batched(result, echo, count):
            yield part


def _response_json(response: ResponsesResponse, echo: dict[str, Any]) -> bytes:
    for name, value in echo.items():
        setattr(response, name, value)
    return response.model_dump_json(by_alias=True, exclude=_VLLM_ONLY).encode()


def _event_json(event: Any, echo: dict[str, Any]) -> bytes:
    response = getattr(event, "response", None)
    if response is None:
        return event.model_dump_json(by_alias=True).encode()
    for name, value in echo.items():
        setattr(response, name, value)
    return event.model_dump_json(by_alias=True, exclude={"response": _VLLM_ONLY}).encode()


async def _batched(
    events: AsyncIterator[Any], echo: dict[str, Any], count: TokenCount
) -> AsyncIterator[ResponsePart]:
    """The stream's events, encoded; each part carries all that arrived since the last one,
    so that a replica that falls behind sends fewer, larger messages (never waits)."""
    buffer: list[bytes] = []
    final: list[bytes] = []
    arrived = asyncio.Event()
    ended = False
    failure: BaseException | None = None

    async def read() -> None:
        nonlocal ended, failure
        try:
            async for event in events:
                data = _event_json(event, echo)
                if event.type in TERMINAL_EVENTS:
                    final.append(data)
                else:
                    buffer.append(b"event: %s\ndata: %s\n\n" % (event.type.encode(), data))
                arrived.set()
        except Exception as exc:
            failure = exc
        finally:
            ended = True
            arrived.set()

    reader = asyncio.ensure_future(read())
    try:
        while True:
            await arrived.wait()
            arrived.clear()
            taken, buffer[:] = b"".join(buffer), []
            if ended:
                if failure is not None:
                    if taken:
                        yield ResponsePart(taken, None, count.prompt, count.completion)
                    raise _stream_failure(failure)
                yield ResponsePart(
                    taken, final[0] if final else None, count.prompt, count.completion
                )
                return
            if taken:
                yield ResponsePart(taken, None, count.prompt, count.completion)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await events.aclose()


def _parse(body: dict[str, Any]) -> ResponsesRequest:
    try:
        return ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()))
        error = InvalidGenerationRequest(
            f"Invalid value for '{param}': {first.get('msg', 'invalid')}." if param
            else f"Invalid request: {first.get('msg', 'invalid')}."
        )
        error.param = param or None
        raise error from None


def _refusal(response: ErrorResponse) -> GenerationError:
    """vLLM's error response (its HTTP status in `code`) as the error the ingress answers with."""
    info = response.error
    status = info.code if isinstance(info.code, int) else 500
    if status >= 500:
        logger.error("The responses handler failed a request: %s", info.message)
        return EngineUnavailable("The model engine failed this request. Retry shortly.")
    error = InvalidGenerationRequest(info.message)
    error.status = status
    error.param = info.param
    if "max_model_len" in info.message or "context length" in info.message:
        error.code = "context_length_exceeded"
        error.param = "input"  # the conversation, replayed history included
    return error


def _stream_failure(exc: BaseException) -> GenerationError:
    if isinstance(exc, GenerationError):
        return exc
    logger.error("A responses stream failed: %r", exc)
    return EngineUnavailable("The model engine failed while generating. Retry shortly.")
