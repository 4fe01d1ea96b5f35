"""The OpenAI wire format as the gateway checks it: requests, and the replies' shapes for the docs.

The model replicas run vLLM's own OpenAI serving layer, which validates each request again and
produces the reply bytes. Here every field of OpenAI's API is either typed (and passed on) or
refused by name: nothing a client asks for is silently dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_CHOICES = 8
MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
# Caps that stop validation early on a hostile body (OpenAI's own: 2048 messages, 10 MiB text,
# 128 tools, 300 logit biases).
MAX_MESSAGES = 2048
MAX_CONTENT_PARTS = 256
MAX_TEXT_CHARS = 10 * 2**20
MAX_STOP_CHARS = 256
MAX_NAME_CHARS = 256
MAX_TOOLS = 128
MAX_LOGIT_BIAS = 300
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
StopText = Annotated[str, Field(max_length=MAX_STOP_CHARS)]
# The engine's sampler takes a 64-bit seed; a larger one failed inside the engine as a 503.
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# More than any context; a larger count overflowed on its way to the engine (a 500).
TokenLimit = Annotated[int, Field(le=2**31 - 1)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
JsonObject = dict[str, Any]

# Fields that only describe the caller or hint at caching: accepted, with nothing to honour.
CALLER_FIELDS = frozenset(
    {"user", "metadata", "service_tier", "safety_identifier", "prompt_cache_key"}
)
# vLLM's own extensions of the API that its serving layer honours (vLLM's docs, "Extra Parameters").
VLLM_FIELDS = frozenset(
    {
        "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
        "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids",
        "bad_words", "prompt_logprobs", "echo", "add_generation_prompt",
        "continue_final_message", "add_special_tokens", "chat_template_kwargs",
        "structured_outputs", "return_tokens_as_token_ids", "return_token_ids", "cache_salt",
        "documents", "repetition_detection",
    }
)
# vLLM's hard token masks: on top of a grammar they can leave no token it accepts.
GRAMMAR_MASKS = ("allowed_token_ids", "bad_words", "min_tokens")
# OpenAI fields a text model behind this gateway cannot honour, with the reason a client reads.
REFUSED_FIELDS = {
    "audio": "audio output is not supported; the model types produce text only",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the legacy 'functions' field is not supported; use 'tools'",
    "function_call": "the legacy 'function_call' field is not supported; use 'tool_choice'",
    "verbosity": "'verbosity' is not supported",
    "prompt_cache_retention": "'prompt_cache_retention' is not supported",
}


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
            raise ValueError("content is required (null only on an assistant message with tool_calls)")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a 'tool' message needs the 'tool_call_id' of the call it answers")
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool = False
    continuous_usage_stats: bool = False


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


class GenerationFields(BaseModel):
    """The sampling fields /v1/chat/completions and /v1/completions share."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str = Field(max_length=256)
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    max_tokens: Annotated[TokenLimit, Field(ge=1)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: Seed | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logit_bias: Annotated[
        dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=MAX_LOGIT_BIAS)
    ] | None = None
    user: Name | None = None
    # vLLM's extensions, used by `vllm bench serve` and other vLLM-aware clients.
    ignore_eos: bool | None = None
    min_tokens: Annotated[TokenLimit, Field(ge=0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        values = [value] if isinstance(value, str) else value or []
        if any(not s for s in values):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isdigit():
                raise ValueError(f"keys must be token ids (digits), got '{key[:40]}'")
        return value

    @property
    def reply_limit(self) -> int | None:
        return self.max_tokens

    @property
    def choices(self) -> int:
        return self.n or 1

    def unsupported_field(self) -> tuple[str, str] | None:
        """The first field that cannot be honoured, and why; None when every field can."""
        for name, value in (self.model_extra or {}).items():
            if name in REFUSED_FIELDS:
                if name == "modalities" and value == ["text"]:
                    continue
                return name, REFUSED_FIELDS[name]
            if name == "store" and value not in (False, None):
                return name, "stored completions are not supported (store must be false)"
            if name not in CALLER_FIELDS and name not in VLLM_FIELDS and name != "store":
                return name, f"Unrecognized request argument supplied: {name}"
        return None

    @property
    def constrained(self) -> bool:
        """Decoding follows a grammar (vLLM's `structured_outputs`)."""
        return bool((self.model_extra or {}).get("structured_outputs"))

    def mask_on_a_grammar(self) -> tuple[str, str] | None:
        """A token mask that can leave a grammar no token it accepts; vLLM then fails the
        request inside the engine (its grammar rejects the token it had to sample)."""
        extra = self.model_extra or {}
        for name in GRAMMAR_MASKS:
            value = self.min_tokens if name == "min_tokens" else extra.get(name)
            if value:
                return name, (
                    f"'{name}' cannot be combined with constrained decoding (a JSON "
                    "response_format, structured_outputs or a forced tool call): together "
                    "they can leave no token the grammar accepts"
                )
        return None

    def to_engine(self) -> dict[str, Any]:
        """The body the model replica's serving layer gets: as sent, less caller-only fields."""
        body = self.model_dump(exclude_unset=True, by_alias=True)
        for name in CALLER_FIELDS:
            body.pop(name, None)
        body.pop("store", None)
        return body


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

    @property
    def constrained(self) -> bool:
        """Decoding follows a grammar: a JSON response format, or a forced tool call."""
        return bool(
            (self.response_format is not None and self.response_format.type != "text")
            or (self.tools and (self.tool_choice == "required"
                                or isinstance(self.tool_choice, NamedToolChoice)))
            or super().constrained
        )

    @property
    def reply_limit(self) -> int | None:
        """`max_completion_tokens` is OpenAI's newer name for `max_tokens`; it wins when both are set."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(GenerationFields):
    """POST /v1/completions (the legacy prompt completion)."""

    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_MESSAGES)]
        | Annotated[list[int], Field(max_length=MAX_TEXT_CHARS)]
        | Annotated[list[Annotated[list[int], Field(max_length=MAX_TEXT_CHARS)]],
                    Field(max_length=MAX_MESSAGES)]
    )
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool | None = None

    def unsupported_field(self) -> tuple[str, str] | None:
        refused = super().unsupported_field() or (
            self.mask_on_a_grammar() if self.constrained else None
        )
        if refused is None and self.echo and self.logprobs is not None and self.stream and (
            max(self.choices, self.best_of or 1) > 1
        ):
            # vLLM 0.32's stream then fails: only one choice carries the prompt's logprobs.
            return "echo", (
                "echo with logprobs is not supported on a stream of more than one choice "
                "(n or best_of above 1): send stream false, n 1, or no logprobs"
            )
        return refused

    @property
    def reply_limit(self) -> int:
        """OpenAI's default for /v1/completions is 16 tokens."""
        return 16 if self.max_tokens is None else self.max_tokens

    @property
    def prompts(self) -> int:
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            return len(self.prompt)
        return 1


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


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "serviceai"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every non-200 response."""

    error: ErrorDetail
