"""How a chat stream cut by a failed replica goes on: the assistant's message so far,
continued by the next replica (vLLM's `continue_final_message`); which fields allow it."""

from __future__ import annotations

from app.apis.chat.protocol import ChatCompletionRequest
from app.apis.chunk_continuation import CONTINUABLE as chunks_continuable
from app.apis.chunk_continuation import ChunkContinuation, common_refusal
from app.serving.continuation import (
    Continuation,
    Continue,
    chunks,
    resumable,
    shortened,
    unclassified,
)
from deployments.wire import ModelInfo

CONTINUABLE = chunks_continuable | {
    "max_completion_tokens",
    "parallel_tool_calls",
    "reasoning_effort",  # only a type that reasons takes it, and its replies never go on
}
"""Fields whose reply goes on on another replica as it went (the length budget shortened)."""
CHECKED = frozenset(
    {"messages", "tools", "tool_choice", "response_format", "n", "logprobs", "top_logprobs"}
)
"""Fields `refusal` and `continuation` look at: they decide by their value."""


def resume(body: ChatCompletionRequest, payload: dict, model: ModelInfo) -> Continue:
    """How a chat stream of `payload` goes on, or why it cannot."""
    reason = unclassified(body.model_fields_set, CONTINUABLE | CHECKED) or refusal(payload, model)
    return resumable(reason, lambda sent, received: continuation(payload, sent, received))


def refusal(payload: dict, model: ModelInfo) -> str | None:
    """Why no chat stream of `payload` can go on elsewhere faithfully, or None."""
    if model.reasoning_parser:
        return "a reasoning model's reply (its reasoning is parsed from the whole output)"
    if payload.get("tools") and payload.get("tool_choice") != "none":
        return "a reply that may call tools"
    format_type = (payload.get("response_format") or {}).get("type", "text")
    return common_refusal(payload) or (
        "structured output half sent" if format_type != "text" else None
    )


def continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The chat request that goes on from the text `sent` (the assistant's message to
    continue), or why there is none (the reply held more than text)."""
    text = []
    for chunk in chunks(sent):
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("tool_calls") or delta.get("reasoning") or delta.get("reasoning_content"):
                return "a reply that holds tool calls or reasoning"
            if choice.get("finish_reason") is not None:
                return "a reply already finished"
            text.append(delta.get("content") or "")
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    said = "".join(text)
    messages = list(payload["messages"])
    if payload.get("continue_final_message"):
        last = messages[-1]
        if not isinstance(last.get("content"), str):
            return "a final message of parts to continue"
        messages[-1] = {**last, "content": last["content"] + said}
    elif said:
        messages.append({"role": "assistant", "content": said})
        body["add_generation_prompt"] = False
        body["continue_final_message"] = True
    body["messages"] = messages
    return ChunkContinuation(body, sent, received)
