"""Anthropic's Messages API on vLLM's own handler in the replica: `AnthropicServingMessages`.

vLLM converts a Messages request to a chat request, generates it with its chat serving layer
(the type's tool-call and reasoning parsers, the grammar and the strict-JSON mend included)
and converts the reply back: a message, or Anthropic's event stream. The ingress relays the
bytes as chat's; a failure inside the stream (vLLM's `error` event) is raised here, for the
ingress to frame as Anthropic's error event as it does every failure. A final assistant message
is continued, as Anthropic's API does with a prefill (vLLM's conversion opens a new turn after
it): a client's prefill, and the ingress's continuation of a stream cut by a failed replica.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncGenerator
from typing import Any

from vllm.entrypoints.anthropic.protocol import (
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
    AnthropicMessagesResponse,
)
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from deployments.vllm_engine.replies import Event, stream_error

_ERROR_EVENT = "event: error\n"
_LAST_EVENT = "event: message_stop\n"
_VLLM_ONLY = {"kv_transfer_params", "ec_transfer_params"}
_THINKING_DELTA = '"type":"thinking_delta"'


class MessagesApi:
    """POST /v1/messages on vLLM's Anthropic handler."""

    request_type = AnthropicMessagesRequest
    prompt_param = "messages"

    def __init__(self, serving: AnthropicServingMessages) -> None:
        continue_prefills()
        self._serving = serving

    def create(self, request: AnthropicMessagesRequest) -> Any:
        return self._serving.create_messages(request)

    def create_error_response(self, error: Exception) -> ErrorResponse:
        return self._serving.create_error_response(error)

    def schema_param(self, body: dict[str, Any]) -> str:
        return "tools"

    def body(self, result: AnthropicMessagesResponse, request: AnthropicMessagesRequest) -> bytes:
        if _thinking_omitted(request):
            for block in result.content:
                if block.type == "thinking":
                    block.thinking = ""
        return result.model_dump_json(exclude=_VLLM_ONLY, exclude_none=True).encode()

    async def events(
        self, stream: AsyncGenerator[str, None], request: AnthropicMessagesRequest
    ) -> AsyncGenerator[Event, None]:
        """Anthropic's events as vLLM writes them; its `error` event is raised."""
        omitted = _thinking_omitted(request)
        try:
            async for event in stream:
                if event.startswith(_ERROR_EVENT):
                    raise stream_error(_error_message(event))
                if omitted and _THINKING_DELTA in event:
                    continue
                yield Event(event.encode(), last=event.startswith(_LAST_EVENT))
        finally:
            await stream.aclose()

    async def prompt_tokens(self, request: AnthropicMessagesRequest) -> int | ErrorResponse:
        """The prompt's tokens as vLLM's count_tokens renders it."""
        counted = await self._serving.count_tokens(
            AnthropicCountTokensRequest.model_validate(
                request.model_dump(include=set(AnthropicCountTokensRequest.model_fields))
            )
        )
        return counted if isinstance(counted, ErrorResponse) else counted.input_tokens


def continue_prefills() -> None:
    """vLLM's conversion to chat, made to continue a final assistant message (generation goes
    on from its text, no new turn), for a prompt's count as for generation."""
    convert = AnthropicServingMessages.to_chat_completion_request
    if getattr(convert, "_serviceai_prefill", False):
        return
    convert = convert.__func__  # type: ignore[attr-defined]  # the classmethod's function

    @functools.wraps(convert)
    def to_chat_completion_request(cls: type, request: Any, **kwargs: Any) -> Any:
        chat = convert(cls, request, **kwargs)
        if request.messages and request.messages[-1].role == "assistant":
            chat.add_generation_prompt = False
            chat.continue_final_message = True
        return chat

    to_chat_completion_request._serviceai_prefill = True  # type: ignore[attr-defined]
    AnthropicServingMessages.to_chat_completion_request = classmethod(  # type: ignore[method-assign,assignment]  # a patch (vllm_internals)
        to_chat_completion_request
    )


def _thinking_omitted(request: AnthropicMessagesRequest) -> bool:
    """`thinking.display: omitted`: thinking blocks come without their text (their signature
    stays, as Anthropic sends them), which vLLM's handler leaves to the gateway."""
    return getattr(request.thinking, "display", None) == "omitted"


def _error_message(event: str) -> str:
    """The message of vLLM's `event: error` (its data line), or the event itself."""
    data = event.partition("data: ")[2].strip()
    try:
        return json.loads(data)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return event[:500]
