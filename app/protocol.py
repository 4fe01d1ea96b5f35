"""The OpenAI chat-completions wire format: requests, responses, stream chunks, model lists."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from deployments.generation import GenerationRequest, SamplingOptions

MAX_CHOICES = 8
MAX_STOP_SEQUENCES = 4
# The engine's sampler takes a 64-bit seed; a larger one failed inside the engine as a 503.
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# More than any context; a larger count overflowed on its way to the engine (a 500).
TokenCount = Annotated[int, Field(le=2**31 - 1)]


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A message of the conversation. `developer` is OpenAI's newer name for `system`."""

    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = False


Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions. Unknown fields are accepted and ignored, as OpenAI clients send many."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str = Field(max_length=256)
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    max_tokens: Annotated[TokenCount, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[TokenCount, Field(ge=1)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: Seed | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extensions, used by `vllm bench serve` and other vLLM-aware clients.
    ignore_eos: bool = False
    min_tokens: Annotated[TokenCount, Field(ge=0)] = 0

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        values = [value] if isinstance(value, str) else value or []
        if any(not s for s in values):
            raise ValueError("stop sequences must not be empty")
        return value

    @property
    def reply_limit(self) -> int | None:
        """`max_completion_tokens` is OpenAI's newer name for `max_tokens`; it wins when both are set."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def to_generation(self, request_id: str) -> GenerationRequest:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return GenerationRequest(
            request_id=request_id,
            messages=tuple(
                ("system" if m.role == "developer" else m.role, m.text()) for m in self.messages
            ),
            sampling=SamplingOptions(
                max_tokens=self.reply_limit,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                frequency_penalty=self.frequency_penalty or 0.0,
                presence_penalty=self.presence_penalty or 0.0,
                stop=stop,
                seed=self.seed,
                n=self.n or 1,
                ignore_eos=self.ignore_eos,
                min_tokens=self.min_tokens,
            ),
        )


FinishReason = Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
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


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    logprobs: None = None
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
