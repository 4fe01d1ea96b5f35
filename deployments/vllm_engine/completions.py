"""/v1/chat/completions and /v1/completions on vLLM's own serving layer (`ServedApi`s).

`OpenAIServingChat` and `OpenAIServingCompletion` (built by vLLM's `init_app_state`) render the
chat template, apply the model's generation_config defaults, run structured outputs, tool-call
and reasoning parsers, and encode the JSON and SSE bytes; here they are called, and their
stream's error events turned into raised errors.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from pydantic import BaseModel, ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.renderers.inputs.preprocess import extract_prompt_len

from deployments.vllm_engine.forced_tool_calls import is_forced
from deployments.vllm_engine.replies import Event, refusal, stream_failure

_ERROR_EVENT = 'data: {"error"'


def compact_json(text: str) -> str:
    """`text` without the whitespace of vLLM's `json.dumps` of parsed arguments (a stream's
    arguments come as the model wrote them: compact), and with any control character in its
    strings escaped (the random test model once got one past the grammar: a raw U+0006 in a
    /v1/responses call); as it is if it is not JSON (a call that max_tokens cut short)."""
    try:
        parsed = json.loads(text, strict=False)
    except ValueError:
        return text
    return json.dumps(parsed, separators=(",", ":"), ensure_ascii=False)


_DONE_EVENT = "data: [DONE]\n\n"


class _SseApi:
    """What chat and completions share: the serving layer's SSE strings as events."""

    request_type: type[BaseModel]
    prompt_param: str

    def __init__(self, serving: Any) -> None:
        self._serving = serving

    def create_error_response(self, error: Exception) -> ErrorResponse:
        return self._serving.create_error_response(error)

    def body(self, result: Any, request: Any) -> bytes:
        forced = is_forced(getattr(request, "tool_choice", None))
        for choice in getattr(result, "choices", ()):
            message = getattr(choice, "message", None)
            if forced and choice.finish_reason == "length" and message and message.tool_calls:
                # A forced call cut short is no call (vLLM drops a cut `required` one, not a
                # named one): OpenAI's reply, and what vLLM's own tests expect.
                message.tool_calls, message.content = [], ""
            for call in getattr(message, "tool_calls", None) or ():
                call.function.arguments = compact_json(call.function.arguments)
        return result.model_dump_json().encode()

    def schema_param(self, body: dict[str, Any]) -> str:
        return "response_format" if body.get("response_format") else "tools"

    async def events(
        self, stream: AsyncGenerator[str, None], request: Any
    ) -> AsyncGenerator[Event, None]:
        """vLLM reports a failure inside a stream as an error event: raised here as the error
        it is (a refusal of the request, a 4xx, or the engine's failure), for the ingress to
        frame."""
        try:
            async for event in stream:
                if event.startswith(_ERROR_EVENT):
                    raise self._stream_error(event)
                yield Event(event.encode(), last=event == _DONE_EVENT)
        finally:
            await stream.aclose()

    def _stream_error(self, event: str) -> Exception:
        try:
            response = ErrorResponse.model_validate_json(event.removeprefix("data: "))
        except ValidationError:
            return stream_failure(RuntimeError(f"unreadable error event {event[:500]!r}"))
        return refusal(response, self, {})

    def _longest(self, inputs: Any) -> int:
        return max(extract_prompt_len(self._serving.model_config, i) for i in inputs)


class ChatApi(_SseApi):
    request_type = ChatCompletionRequest
    prompt_param = "messages"

    def __init__(self, serving: OpenAIServingChat) -> None:
        super().__init__(serving)
        self.create = serving.create_chat_completion

    async def prompt_tokens(self, request: ChatCompletionRequest) -> int | ErrorResponse:
        rendered = await self._serving.render_chat_request(request)
        return rendered if isinstance(rendered, ErrorResponse) else self._longest(rendered[1])


class CompletionApi(_SseApi):
    request_type = CompletionRequest
    prompt_param = "prompt"

    def __init__(self, serving: OpenAIServingCompletion) -> None:
        super().__init__(serving)
        self.create = serving.create_completion

    async def prompt_tokens(self, request: CompletionRequest) -> int | ErrorResponse:
        """The longest of the request's prompts."""
        rendered = await self._serving.render_completion_request(request)
        return rendered if isinstance(rendered, ErrorResponse) else self._longest(rendered)
