"""How a Messages stream cut by a failed replica goes on: the text so far as a final
assistant message (Anthropic's prefill, which the next replica continues); which fields
allow it."""

from __future__ import annotations

from typing import Any

from app.apis.messages.protocol import MessagesRequest
from app.serving.continuation import (
    Continuation,
    Continue,
    chunks,
    resumable,
    shortened,
    unclassified,
)
from deployments.wire import ModelInfo

CONTINUABLE = frozenset(
    {
        "model",
        "stream",
        "max_tokens",
        "system",
        "stop_sequences",
        "temperature",
        "top_k",
        "top_p",
        "metadata",
        "context_management",
        "thinking",  # only a type that reasons takes it, and its replies never go on
    }
)
"""Fields whose reply goes on on another replica as it went (the length budget shortened)."""
CHECKED = frozenset({"messages", "tools", "tool_choice", "output_config"})
"""Fields `refusal` and `continuation` look at: they decide by their value."""


def resume(body: MessagesRequest, payload: dict, model: ModelInfo) -> Continue:
    """How a Messages stream of `payload` goes on, or why it cannot."""
    reason = unclassified(body.model_fields_set, CONTINUABLE | CHECKED) or refusal(payload, model)
    return resumable(reason, lambda sent, received: continuation(payload, sent, received))


class MessagesContinuation(Continuation):
    """Anthropic's events: the message and its text block were opened by the first reply."""

    def __init__(self, payload: dict, received: int, block_open: bool) -> None:
        super().__init__(payload, received)
        self._block_open = block_open

    def kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        if kind == "message_start" or (kind == "content_block_start" and self._block_open):
            return None
        if kind == "message_delta":
            self.usage(event.get("usage"), "input_tokens", "output_tokens", "")
        return event


def refusal(payload: dict, model: ModelInfo) -> str | None:
    """Why no Messages stream of `payload` can go on elsewhere faithfully, or None."""
    if model.reasoning_parser:
        return "a reasoning model's reply (its reasoning is parsed from the whole output)"
    if payload.get("tools") and (payload.get("tool_choice") or {}).get("type") != "none":
        return "a reply that may call tools"
    if (payload.get("output_config") or {}).get("format"):
        return "structured output half sent"
    return None


def continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The Messages request that goes on from the text `sent`: a final assistant message
    (Anthropic's prefill, which the replica continues), or why there is none."""
    text, block_open = [], False
    for event in chunks(sent):
        kind = event.get("type")
        if kind == "content_block_start":
            if event.get("index") != 0 or event["content_block"].get("type") != "text":
                return "a reply that holds more than one text block"
            block_open = True
        elif kind == "content_block_delta":
            if event["delta"].get("type") != "text_delta":
                return "a reply that holds more than text"
            text.append(event["delta"]["text"])
        elif kind in ("content_block_stop", "message_delta", "message_stop"):
            return "a reply already finished"
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    said = "".join(text)
    messages = list(payload["messages"])
    if said and messages[-1].get("role") == "assistant":  # the client's own prefill
        content = messages[-1]["content"]
        if not isinstance(content, str):
            return "a final message of blocks to continue"
        messages[-1] = {**messages[-1], "content": content + said}
    elif said:
        messages.append({"role": "assistant", "content": said})
    body["messages"] = messages
    return MessagesContinuation(body, received, block_open)
