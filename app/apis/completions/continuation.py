"""How a completion stream cut by a failed replica goes on: the text so far after the
prompt; which fields allow it."""

from __future__ import annotations

from app.apis.chunk_continuation import CONTINUABLE as chunks_continuable
from app.apis.chunk_continuation import ChunkContinuation, common_refusal
from app.apis.completions.protocol import CompletionRequest
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
    "best_of",  # more than `n` is refused before; `n` decides
}
"""Fields whose reply goes on on another replica as it went (the length budget shortened)."""
CHECKED = frozenset({"prompt", "suffix", "n", "logprobs", "echo"})
"""Fields `refusal` and `continuation` look at: they decide by their value."""


def resume(body: CompletionRequest, payload: dict, model: ModelInfo) -> Continue:
    """How a completion stream of `payload` goes on, or why it cannot."""
    reason = unclassified(body.model_fields_set, CONTINUABLE | CHECKED) or refusal(payload)
    return resumable(reason, lambda sent, received: continuation(payload, sent, received))


def refusal(payload: dict) -> str | None:
    """Why no completion stream of `payload` can go on elsewhere faithfully, or None."""
    prompt = payload.get("prompt")
    if not isinstance(prompt, str) and not (
        isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
    ):
        return "a prompt of token ids, or several prompts"
    if payload.get("suffix"):
        return "a suffix"
    return common_refusal(payload)


def continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The completion request that goes on from the text `sent`, after its prompt."""
    text = []
    for chunk in chunks(sent):
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason") is not None:
                return "a reply already finished"
            text.append(choice.get("text") or "")
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    prompt = payload["prompt"]
    body["prompt"] = (prompt if isinstance(prompt, str) else prompt[0]) + "".join(text)
    return ChunkContinuation(body, sent, received)
