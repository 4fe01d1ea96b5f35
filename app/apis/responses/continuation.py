"""How a Responses stream cut by a failed replica goes on: the text so far as a final
assistant message in progress (which vLLM's Responses handler continues), under the first
response's identity; which fields allow it."""

from __future__ import annotations

from typing import Any

import orjson

from app.apis.responses.protocol import ResponseCreateRequest
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
        "background",
        "store",
        "max_output_tokens",
        "instructions",
        "previous_response_id",
        "temperature",
        "top_p",
        "seed",
        "ignore_eos",
        "parallel_tool_calls",
        "metadata",
        "client_metadata",
        "prompt_cache_key",
        "safety_identifier",
        "user",
        "reasoning",  # only a type that reasons takes it, and its replies never go on
    }
)
"""Fields whose reply goes on on another replica as it went (the length budget shortened)."""
CHECKED = frozenset({"input", "tools", "tool_choice", "text", "top_logprobs", "include"})
"""Fields `refusal` and `continuation` look at: they decide by their value."""


def resume(body: ResponseCreateRequest, payload: dict, model: ModelInfo) -> Continue:
    """How a Responses stream of `payload` goes on, or why it cannot."""
    reason = unclassified(body.model_fields_set, CONTINUABLE | CHECKED) or refusal(payload, model)
    return resumable(reason, lambda sent, received: continuation(payload, sent, received))


class ResponsesContinuation(Continuation):
    """OpenAI's Responses events: the first response's id, creation time and output item, its
    sequence numbers going on, and the done events' text whole."""

    def __init__(self, payload: dict, received: int, first: dict, said: str) -> None:
        super().__init__(payload, received)
        self._response = first["response"]
        self._item = first["item"]
        self._part_open = first["part_open"]
        self._sequence = first["sequence"]
        self._said = said

    def kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        if kind in ("response.created", "response.in_progress"):
            return None
        if kind == "response.output_item.added" and self._item is not None:
            return None
        if kind == "response.content_part.added" and self._part_open:
            return None
        return self._one_reply(event)

    def rewritten(self, final: bytes) -> dict[str, Any]:
        return self._one_reply(orjson.loads(final))

    def _one_reply(self, event: dict[str, Any]) -> dict[str, Any]:
        self._sequence += 1
        event["sequence_number"] = self._sequence
        if self._item is not None and "item_id" in event:
            event["item_id"] = self._item
        if "text" in event:  # response.output_text.done
            event["text"] = self._said + event["text"]
        if (event.get("part") or {}).get("type") == "output_text":
            event["part"]["text"] = self._said + event["part"]["text"]
        if "item" in event:
            self._whole(event["item"])
        response = event.get("response")
        if response is not None:
            response["id"] = self._response["id"]
            response["created_at"] = self._response["created_at"]
            for item in response.get("output") or ():
                self._whole(item)
            self.usage(response.get("usage"), "input_tokens", "output_tokens", "total_tokens")
        return event

    def _whole(self, item: dict[str, Any]) -> None:
        if item.get("type") != "message":
            return
        if self._item is not None:
            item["id"] = self._item
        texts = [c for c in item.get("content") or () if c.get("type") == "output_text"]
        if texts:
            texts[0]["text"] = self._said + texts[0]["text"]


def refusal(payload: dict, model: ModelInfo) -> str | None:
    """Why no Responses stream of `payload` can go on elsewhere faithfully, or None."""
    if model.reasoning_parser:
        return "a reasoning model's reply (its reasoning is parsed from the whole output)"
    if payload.get("tools") and payload.get("tool_choice") != "none":
        return "a reply that may call tools"
    if ((payload.get("text") or {}).get("format") or {}).get("type", "text") != "text":
        return "structured output half sent"
    if payload.get("top_logprobs") or any("logprobs" in i for i in payload.get("include") or ()):
        return "logprobs"
    return None


def continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The Responses request that goes on from the text `sent`: a final assistant message in
    progress (which vLLM's Responses handler continues), or why there is none."""
    first: dict[str, Any] = {"response": None, "item": None, "part_open": False, "sequence": -1}
    text = []
    for event in chunks(sent):
        kind = event.get("type")
        first["sequence"] = max(first["sequence"], event.get("sequence_number", -1))
        if kind == "response.created":
            first["response"] = event["response"]
        elif kind == "response.output_item.added":
            if event.get("output_index") != 0 or event["item"].get("type") != "message":
                return "a reply that holds more than one message"
            first["item"] = event["item"]["id"]
        elif kind == "response.content_part.added":
            if event.get("content_index") != 0:
                return "a reply that holds more than one part"
            first["part_open"] = True
        elif kind == "response.output_text.delta":
            text.append(event["delta"])
        elif kind != "response.in_progress":
            return "a reply that holds more than text, or is finished"
    if first["response"] is None:
        return "a stream that never started"
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    said = "".join(text)
    if said:
        given = payload["input"]
        items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        item = {"type": "message", "id": first["item"], "role": "assistant"}
        item |= {"status": "in_progress", "content": [_output_text(said)]}
        body["input"] = [*items, item]
    return ResponsesContinuation(body, received, first, said)


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}
