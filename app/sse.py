"""Server-sent events of a streamed chat completion, in the exact shape OpenAI sends.

Chunks are built as plain dicts and encoded with orjson: this runs once per generated token,
and `tests/app/test_sse.py` proves the output equals the pydantic `ChatCompletionChunk`.
"""

from __future__ import annotations

from typing import Any

import orjson

DONE = "[DONE]"


class ChunkEncoder:
    """Encodes the chunks of one stream; every chunk carries the same id, created and model."""

    __slots__ = ("_id", "_created", "_model", "_usage_field")

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self._id = completion_id
        self._created = created
        self._model = model
        # With include_usage, OpenAI sends "usage": null on every chunk but the last.
        self._usage_field = include_usage

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
        chunk: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": choices,
        }
        if self._usage_field:
            chunk["usage"] = usage
        return orjson.dumps(chunk).decode()

    def role(self, index: int) -> str:
        return self._chunk([_choice(index, {"role": "assistant", "content": ""}, None)])

    def content(self, index: int, text: str, finish_reason: str | None = None) -> str:
        delta = {"content": text} if text else {}
        return self._chunk([_choice(index, delta, finish_reason)])

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        return self._chunk(
            [],
            {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        )


def _choice(index: int, delta: dict[str, str], finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def error_event(body: dict[str, Any]) -> str:
    """An error after the stream began: the client raises on a `data: {"error": ...}` event."""
    return orjson.dumps(body).decode()
