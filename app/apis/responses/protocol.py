"""The OpenAI Responses wire format as the gateway checks it: what is served, what is refused.

The model replica's vLLM validates the rest. Here: the fields the service cannot honour are
refused with a 400 naming them (never ignored), input items are checked and given ids (they
are stored and paged by id), and the body for the replica is built: the whole conversation,
with `store` off and no `previous_response_id`, because the gateway keeps the store.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.openai.errors import ApiError
from app.openai.protocol import MAX_MESSAGES, MAX_TOOLS, Seed, Structure, Text

BUILT_IN_TOOLS = (
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use",
    "computer_use_preview",
    "mcp",
    "image_generation",
    "local_shell",
    "shell",
    "apply_patch",
)
# Fields of OpenAI's request the service cannot honour, refused when set to anything but
# their "off" value (SDKs send some of them as null or empty on every call).
_REFUSED: dict[str, tuple[Any, ...]] = {
    "prompt": (None,),
    "conversation": (None,),
    "truncation": (None, "disabled"),
    "service_tier": (None, "auto", "default"),
    "max_tool_calls": (None,),
    "stream_options": (None,),
}
_CALLER_ONLY = {"prompt_cache_key", "safety_identifier", "client_metadata"}
"""Fields that describe the caller or hint at caching, as on chat (the router's prefix
affinity keeps a conversation's prefix warm on its own): accepted, not sent to the replica."""
LOGPROBS = "message.output_text.logprobs"
_INCLUDES = ("reasoning.encrypted_content", LOGPROBS)
"""`include` values served: reasoning items carry their reasoning in clear (`content`), so a
client that keeps no state (`store: false`, as Codex) sends them back as they are; each
`output_text` part carries its tokens' `logprobs` (with `top_logprobs` alternatives each)."""
_ROLES = ("user", "system", "developer", "assistant")
_PART_TYPES = ("input_text", "output_text")


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class Reasoning(BaseModel):
    """How a model that reasons does (on a type with a reasoning parser)."""

    model_config = ConfigDict(extra="forbid")

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None

    @property
    def asked(self) -> bool:
        """The request asks the model to reason (any effort but none)."""
        return self.effort != "none"


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: TextFormat | None = None


class ResponseCreateRequest(BaseModel):
    """POST /v1/responses. Fields outside this model are refused by name (see `refusal`)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(max_length=256)
    input: Text | Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)]
    instructions: Text | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    text: TextConfig | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunction | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    parallel_tool_calls: bool | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    """Answer at once with the response queued; it is generated here, stored, and read with
    GET /v1/responses/{id} (or cancelled) through any ingress replica."""
    previous_response_id: str | None = Field(None, max_length=64)
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(None, max_length=16)
    user: str | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """With include message.output_text.logprobs: the likeliest alternatives of each token."""
    prompt_cache_key: str | None = Field(None, max_length=1024)
    safety_identifier: str | None = Field(None, max_length=1024)
    client_metadata: dict[str, Any] | None = None
    """Codex sends its turn's ids here on every request."""
    # vLLM's extensions, as in chat: a seed for reproducible sampling, and generating up to
    # max_output_tokens even past end-of-text.
    seed: Seed | None = None
    ignore_eos: bool = False

    def structures(self) -> Iterator[Structure]:
        """What the request makes the engine compile (app.limits.structure_bounds)."""
        text_format = self.text.format if self.text is not None else None
        if text_format is not None and text_format.schema_ is not None:
            yield "text.format.schema", "schema", text_format.schema_
        if self.tool_choice not in (None, "auto", "none"):  # a forced call follows them
            for i, tool in enumerate(self.tools or ()):
                if isinstance(tool, dict) and "parameters" in tool:
                    yield f"tools[{i}].parameters", "schema", tool["parameters"]

    def check(self) -> None:
        """Refuse what the service cannot honour: a 400 naming the field."""
        if self.background and not self.store:
            raise ApiError(
                400,
                "A background response is read back from the store: send store true.",
                param="store",
                code="invalid_value",
            )
        if self.background and self.stream:
            raise unsupported(
                "background",
                "A background response is not streamed here: create it without stream and "
                "poll GET /v1/responses/{id}, or stream it without background.",
            )
        for name, value in (self.model_extra or {}).items():
            if name not in _REFUSED:
                raise unsupported(name, f"'{name}' is not a parameter of /v1/responses.")
            if value not in _REFUSED[name]:
                raise unsupported(name, f"ServiceAi does not support '{name}' on /v1/responses.")
        for index, value in enumerate(self.include or ()):
            if value not in _INCLUDES:
                raise unsupported(
                    f"include[{index}]",
                    f"'{str(value)[:64]}' cannot be included: ServiceAi serves "
                    f"{', '.join(_INCLUDES)}.",
                )
        if self.top_logprobs and LOGPROBS not in (self.include or ()):
            raise ApiError(
                400,
                f"top_logprobs comes with each token's logprobs: add '{LOGPROBS}' to include.",
                param="top_logprobs",
                code="invalid_value",
            )
        summary = self.reasoning and (self.reasoning.summary or self.reasoning.generate_summary)
        if summary not in (None, "auto"):
            raise unsupported(
                "reasoning.summary",
                "Reasoning summaries are not generated: each reasoning item carries the "
                "reasoning itself in its content. Use 'auto' or leave it out.",
            )
        for index, tool in enumerate(self.tools or ()):
            kind = tool.get("type")
            if kind != "function":
                raise unsupported(
                    f"tools[{index}].type",
                    f"Built-in tool '{kind}' is not available on ServiceAi: only function "
                    "tools are.",
                )
            try:
                FunctionTool.model_validate(tool)
            except ValueError as exc:
                raise ApiError(
                    400,
                    f"Invalid function tool: {_first_error(exc)}.",
                    param=f"tools[{index}]",
                    code="invalid_value",
                ) from None
        if isinstance(self.tool_choice, NamedFunction):
            names = [t.get("name") for t in self.tools or ()]
            if self.tool_choice.name not in names:
                raise ApiError(
                    400,
                    f"tool_choice names function '{self.tool_choice.name}', which is not in tools.",
                    param="tool_choice",
                    code="invalid_value",
                )

    def new_items(self) -> list[dict[str, Any]]:
        """This turn's input as checked items, each with an id."""
        if isinstance(self.input, str):
            return [_message("user", [{"type": "input_text", "text": self.input}])]
        return [_checked_item(item, index) for index, item in enumerate(self.input)]

    def payload(self, response_id: str, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        """What the model replica gets: everything the model must see (the whole
        conversation), and what the gateway does with the response, for the replica to echo
        (it stores nothing, and resolves no previous id)."""
        body = self.model_dump(
            exclude_none=True,
            by_alias=True,
            exclude={"background", *_CALLER_ONLY, *(self.model_extra or {})},
        )
        body.update(
            input=conversation,
            request_id=response_id,
            store=self.store,
            previous_response_id=self.previous_response_id,
        )
        return body


def new_response_id() -> str:
    return f"resp_{secrets.token_hex(24)}"


def _message(
    role: str, content: list[dict[str, Any]], item_id: str | None = None
) -> dict[str, Any]:
    return {
        "id": item_id or f"msg_{secrets.token_hex(24)}",
        "type": "message",
        "role": role,
        "content": content,
    }


def _checked_item(item: dict[str, Any], index: int) -> dict[str, Any]:
    kind = item.get("type", "message")
    where = f"input[{index}]"
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise invalid(f"{where}.role", f"role must be one of {', '.join(_ROLES)}")
        content = item.get("content")
        if isinstance(content, str):
            parts = [
                {"type": "output_text" if role == "assistant" else "input_text", "text": content}
            ]
        elif isinstance(content, list):
            parts = [_checked_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)]
        else:
            raise invalid(f"{where}.content", "content must be a string or a list of text parts")
        return _message(role, parts, _string(item.get("id"), f"{where}.id"))
    if kind == "function_call":
        return {
            "id": _string(item.get("id"), f"{where}.id") or f"fc_{secrets.token_hex(24)}",
            "type": "function_call",
            "call_id": _required(item, "call_id", where),
            "name": _required(item, "name", where),
            "arguments": _required(item, "arguments", where),
            "status": "completed",
        }
    if kind == "reasoning":
        # A reasoning item sent back (a client that keeps no state): the model sees it again.
        content = item.get("content") or []
        if not isinstance(content, list) or not all(
            isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
        ):
            raise invalid(f"{where}.content", "content must be a list of reasoning_text parts")
        return {
            "id": _string(item.get("id"), f"{where}.id") or f"rs_{secrets.token_hex(24)}",
            "type": "reasoning",
            "summary": _summary(item.get("summary"), f"{where}.summary"),
            "content": [{"type": "reasoning_text", "text": p["text"]} for p in content],
        }
    if kind == "function_call_output":
        return {
            "id": _string(item.get("id"), f"{where}.id") or f"fco_{secrets.token_hex(24)}",
            "type": "function_call_output",
            "call_id": _required(item, "call_id", where),
            "output": _required(item, "output", where),
        }
    raise unsupported(
        f"{where}.type",
        f"Input items of type '{str(kind)[:64]}' are not supported: send messages, "
        "reasoning, function_call and function_call_output items.",
    )


def _summary(value: Any, where: str) -> list[dict[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in value
    ):
        raise invalid(where, "summary must be a list of summary_text parts")
    return [{"type": "summary_text", "text": p["text"]} for p in value]


def _checked_part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict) or part.get("type") not in _PART_TYPES:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise unsupported(
            f"{where}.type",
            f"Content parts of type '{str(kind)[:64]}' are not supported: send input_text.",
        )
    text = part.get("text")
    if not isinstance(text, str):
        raise invalid(f"{where}.text", "text must be a string")
    checked = {"type": part["type"], "text": text}
    if part["type"] == "output_text":
        checked["annotations"] = []
    return checked


def _required(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise invalid(f"{where}.{name}", f"'{name}' must be a string")
    return value


def _string(value: Any, param: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise invalid(param, "must be a string")
    return value


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors) and errors():
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
    return str(exc)


def invalid(param: str, message: str) -> ApiError:
    return ApiError(
        400, f"Invalid value for '{param}': {message}.", param=param, code="invalid_value"
    )


def unsupported(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="unsupported_parameter")
