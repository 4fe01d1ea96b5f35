"""Anthropic's Messages request as the gateway checks it: what is served, what is refused.

The model replica's vLLM validates the rest (`vllm/entrypoints/anthropic/`: the request becomes
a chat request there). Here: the fields the service cannot honour are refused with a 400 naming
them, never ignored, and an image on a type that reads only text is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from app.openai.protocol import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_TOOLS,
    StopTexts,
    Structure,
    Text,
)

# Fields of Anthropic's request the service cannot honour, and why.
REFUSED_FIELDS = {
    "service_tier": "service tiers are not offered",
    "container": "code execution containers are not offered",
    "mcp_servers": "remote MCP servers are not offered",
}
CLEAR_THINKING = "clear_thinking_20251015"
"""The one context edit served: thinking blocks of earlier turns left out of the prompt."""


class MessagesRequest(BaseModel):
    """POST /v1/messages (and, without `max_tokens`, /v1/messages/count_tokens)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int = Field(ge=1)
    system: Text | Annotated[list[dict[str, Any]], Field(max_length=MAX_CONTENT_PARTS)] | None = (
        None
    )
    stop_sequences: StopTexts | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    """`effort` (on a type that reasons) and `format` (a JSON schema the reply follows)."""
    context_management: dict[str, Any] | None = None
    """`edits`: clear_thinking_20251015 only (Claude Code sends it on every turn)."""

    def unsupported_field(self) -> tuple[str, str] | None:
        """The first field that cannot be honoured, and why; None when every field can."""
        for name in self.model_extra or {}:
            reason = REFUSED_FIELDS.get(name, "Unrecognized request argument supplied")
            return name, f"{name}: {reason}."
        if (refused := self._refused_edit()) is not None:
            return refused
        for i, message in enumerate(self.messages):
            content = message.get("content")
            for j, block in enumerate(content if isinstance(content, list) else ()):
                if isinstance(block, dict) and block.get("type") in ("image", "document"):
                    return (
                        f"messages[{i}].content[{j}]",
                        f"{block['type']} blocks are not supported: the model types read text",
                    )
        return None

    def _refused_edit(self) -> tuple[str, str] | None:
        edits = (self.context_management or {}).get("edits", [])
        if not isinstance(edits, list):
            return "context_management.edits", "context_management.edits must be a list"
        for i, edit in enumerate(edits):
            kind = edit.get("type") if isinstance(edit, dict) else None
            if kind != CLEAR_THINKING:
                return (
                    f"context_management.edits[{i}]",
                    f"context edit {kind!r} is not offered: only {CLEAR_THINKING}",
                )
            if _thinking_turns_kept(edit) is None:
                return (
                    f"context_management.edits[{i}].keep",
                    "keep must be 'all' or {'type': 'thinking_turns', 'value': N} with N >= 1",
                )
        return None

    def _messages_after_edits(self) -> list[dict[str, Any]]:
        """The messages with clear_thinking applied: thinking blocks only in the last `keep`
        assistant turns that have any (Anthropic's default keep: one turn)."""
        edits = (self.context_management or {}).get("edits") or []
        kept = min((_thinking_turns_kept(edit) or 0 for edit in edits), default=None)
        if not kept:
            return self.messages
        thinking_turns = [i for i, m in enumerate(self.messages) if _has_thinking(m)]
        cleared = set(thinking_turns[: int(max(len(thinking_turns) - kept, 0))])
        return [
            {**m, "content": [b for b in m["content"] if not _is_thinking(b)]}
            if i in cleared
            else m
            for i, m in enumerate(self.messages)
        ]

    def structures(self) -> Iterator[Structure]:
        """What the request makes the engine compile (app.limits.structure_bounds)."""
        output_format = (self.output_config or {}).get("format")
        if isinstance(output_format, dict) and "schema" in output_format:
            yield "output_config.format.schema", "schema", output_format["schema"]
        if (self.tool_choice or {}).get("type") in ("any", "tool"):  # a forced call follows
            for i, tool in enumerate(self.tools or ()):
                if isinstance(tool, dict) and "input_schema" in tool:
                    yield f"tools[{i}].input_schema", "schema", tool["input_schema"]

    @property
    def thinks(self) -> bool:
        """The request asks the model to reason before it answers."""
        thinking = self.thinking or {}
        return bool(thinking) and thinking.get("type") != "disabled"

    @property
    def effort(self) -> str | None:
        return (self.output_config or {}).get("effort")

    def to_engine(self) -> dict[str, Any]:
        """The body the replica's Anthropic handler gets: as sent, with context edits applied
        and thinking as Anthropic's: asked for, at Anthropic's default effort (high) when no
        effort is given, which opens thinking in chat templates where it is opt-in (vLLM maps
        the effort to `enable_thinking`); not asked for, off whatever the effort (vLLM would
        open it from an effort alone; Claude Code sends one on every turn)."""
        body = self.model_dump(exclude_unset=True)
        if body.pop("context_management", None) is not None:
            body["messages"] = self._messages_after_edits()
        if self.thinks and self.effort is None:
            body["output_config"] = {**(self.output_config or {}), "effort": "high"}
        elif not self.thinks and self.effort is not None:
            body["thinking"] = {"type": "disabled"}
        return body


def _thinking_turns_kept(edit: dict[str, Any]) -> float | None:
    """How many turns' thinking an edit keeps (infinite for 'all'); None when it is invalid."""
    keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
    if keep == "all":
        return float("inf")
    if not isinstance(keep, dict) or keep.get("type") != "thinking_turns":
        return None
    value = keep.get("value")
    return value if type(value) is int and value >= 1 else None


def _is_thinking(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking")


def _has_thinking(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return (
        message.get("role") == "assistant"
        and isinstance(content, list)
        and any(_is_thinking(b) for b in content)
    )


class CountTokensRequest(MessagesRequest):
    """POST /v1/messages/count_tokens: a Messages request with no reply to bound."""

    max_tokens: int = Field(1, ge=1)

    def to_engine(self) -> dict[str, Any]:
        """The body the replica renders: a Messages request (whose `max_tokens` it needs)."""
        return {**super().to_engine(), "max_tokens": self.max_tokens}
