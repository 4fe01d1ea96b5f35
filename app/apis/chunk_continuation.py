"""What chat and completion streams share when one goes on on another replica (their
continuation rules: app/apis/chat/ and app/apis/completions/): OpenAI's chunks, and the
refusals of the fields both take."""

from __future__ import annotations

from typing import Any

from app.serving.continuation import Continuation, first_identity

CONTINUABLE = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "seed",
        "stop",
        "stop_token_ids",
        "bad_words",
        "allowed_token_ids",
        "logit_bias",
        "ignore_eos",
        "user",
    }
)
"""The fields chat and completions both take whose reply goes on on another replica as it
went (the length budget shortened)."""


class ChunkContinuation(Continuation):
    """Chat and completion chunks: the first reply's id and creation time, no second role."""

    def __init__(self, payload: dict, sent: list[bytes], received: int) -> None:
        super().__init__(payload, received)
        self._id, self._created = first_identity(sent)
        self._opened = False

    def kept(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        chunk["id"], chunk["created"] = self._id, self._created
        self.usage(chunk.get("usage"), "prompt_tokens", "completion_tokens", "total_tokens")
        if self._opened:
            return chunk
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if delta is not None and "role" in delta:
                # The new reply's opening chunk: the client had the role from the first one.
                self._opened = True
                del delta["role"]
                keep = bool(delta.get("content")) or choice.get("finish_reason") is not None
                return chunk if keep else None
        self._opened = bool(chunk.get("choices"))
        return chunk


def common_refusal(payload: dict) -> str | None:
    """Why a chat or completion stream cannot go on for a field both APIs take, or None."""
    if (payload.get("n") or 1) > 1:
        return "n > 1"
    if payload.get("logprobs") or payload.get("top_logprobs") or payload.get("prompt_logprobs"):
        return "logprobs"
    if payload.get("echo"):
        return "echo"
    if payload.get("structured_outputs"):
        return "structured output half sent"
    return None
