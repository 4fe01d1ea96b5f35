"""POST /v1/chat/completions as the gateway checks it: messages, tools, response formats, and
the replies' shapes for the docs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.openai.protocol import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    GenerationFields,
    JsonObject,
    Name,
    Structure,
    Text,
    TokenLimit,
)


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text"]
    text: Text


class ContentPart(BaseModel):
    """Any content part; only text parts reach the model (`only_text` refuses the rest)."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: str = Field(max_length=64)


class FunctionCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """A message of the conversation. `developer` is OpenAI's newer name for `system`.

    An assistant message may have null content when it carries `tool_calls`; a `tool` message
    answers one call by its `tool_call_id`.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    name: Name | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: Name | None = None
    refusal: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, value: str | list[ContentPart] | None) -> Any:
        for part in value if isinstance(value, list) else ():
            if part.type != "text":
                raise ValueError(
                    f"content parts of type '{part.type}' are not supported: the model types "
                    "take text only (use parts of type 'text')"
                )
            TextPart.model_validate(part.model_dump())
        return value

    @model_validator(mode="after")
    def _content_or_tool_calls(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(
                "content is required (null only on an assistant message with tool_calls)"
            )
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a 'tool' message needs the 'tool_call_id' of the call it answers")
        return self


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    name: str = Field(max_length=64)
    description: str | None = None
    json_schema: JsonObject | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object with a 'schema'")
        return self


class ChatCompletionRequest(GenerationFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: Annotated[TokenLimit, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None

    def unsupported_field(self) -> tuple[str, str] | None:
        refused = super().unsupported_field()
        if refused is not None or not self.constrained:
            return refused
        return self.mask_on_a_grammar()

    def structures(self) -> Iterator[Structure]:
        yield from super().structures()
        if self.response_format is not None and self.response_format.json_schema is not None:
            schema = self.response_format.json_schema.json_schema
            yield "response_format.json_schema.schema", "schema", schema
        if self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice):
            for i, tool in enumerate(self.tools or ()):  # a forced call follows their schemas
                yield f"tools[{i}].function.parameters", "schema", tool.function.parameters

    @property
    def constrained(self) -> bool:
        """Decoding follows a grammar: a JSON response format, or a forced tool call."""
        return bool(
            (self.response_format is not None and self.response_format.type != "text")
            or (
                self.tools
                and (
                    self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)
                )
            )
            or super().constrained
        )

    @property
    def reply_limit(self) -> int | None:
        """`max_completion_tokens` is OpenAI's newer name for `max_tokens`; it wins when both are set."""
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


FinishReason = Literal["stop", "length", "tool_calls"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: JsonObject | None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[JsonObject] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    logprobs: JsonObject | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed completion (`data: {chunk}`)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
