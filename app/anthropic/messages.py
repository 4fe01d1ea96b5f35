"""Anthropic's Messages request as the gateway checks it: what is served, what is refused.

The model replica's vLLM validates the rest (`vllm/entrypoints/anthropic/`: the request becomes
a chat request there). Here: the fields the service cannot honour are refused with a 400 naming
them, never ignored, and an image on a type that reads only text is refused by name.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Fields of Anthropic's request the service cannot honour, and why.
REFUSED_FIELDS = {
    "service_tier": "service tiers are not offered",
    "container": "code execution containers are not offered",
    "mcp_servers": "remote MCP servers are not offered",
    "context_management": "server-side context management is not offered",
}


class MessagesRequest(BaseModel):
    """POST /v1/messages (and, without `max_tokens`, /v1/messages/count_tokens)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    """`effort` (on a type that reasons) and `format` (a JSON schema the reply follows)."""

    def unsupported_field(self) -> tuple[str, str] | None:
        """The first field that cannot be honoured, and why; None when every field can."""
        for name in self.model_extra or {}:
            reason = REFUSED_FIELDS.get(name, "Unrecognized request argument supplied")
            return name, f"{name}: {reason}."
        for i, message in enumerate(self.messages):
            content = message.get("content")
            for j, block in enumerate(content if isinstance(content, list) else ()):
                if isinstance(block, dict) and block.get("type") in ("image", "document"):
                    return (
                        f"messages[{i}].content[{j}]",
                        f"{block['type']} blocks are not supported: the model types read text",
                    )
        return None

    @property
    def thinks(self) -> bool:
        """The request asks the model to reason before it answers."""
        return bool(self.thinking) and self.thinking.get("type") != "disabled"

    @property
    def effort(self) -> str | None:
        return (self.output_config or {}).get("effort")

    def to_engine(self) -> dict[str, Any]:
        """The body the replica's Anthropic handler gets: as sent, with thinking asked for
        at Anthropic's default effort (high) when no effort is given, which opens thinking in
        chat templates where it is opt-in (vLLM maps the effort to `enable_thinking`)."""
        body = self.model_dump(exclude_unset=True)
        if self.thinks and self.effort is None:
            body["output_config"] = {**(self.output_config or {}), "effort": "high"}
        return body


class CountTokensRequest(MessagesRequest):
    """POST /v1/messages/count_tokens: a Messages request with no reply to bound."""

    max_tokens: int = Field(1, ge=1)

    def to_engine(self) -> dict[str, Any]:
        """The body the replica renders: a Messages request (whose `max_tokens` it needs)."""
        return {**super().to_engine(), "max_tokens": self.max_tokens}
