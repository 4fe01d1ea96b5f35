"""What OpenAI's chat and completions APIs share, as the gateway checks it: the caps, the
sampling fields, the fields refused by name, and the shapes of models and errors.

The model replicas run vLLM's own OpenAI serving layer, which validates each request again and
produces the reply bytes. Here every field of OpenAI's API is either typed (and passed on) or
refused by name: nothing a client asks for is silently dropped. Chat: app.apis.chat.protocol;
completions: app.apis.completions.protocol; responses: app.apis.responses.protocol.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_CHOICES = 8
MAX_TOP_LOGPROBS = 20
# Caps that stop validation early on a hostile body, the same for the same thing on every API
# (OpenAI's own: 2048 messages, 10 MiB text, 128 tools, 300 logit biases; docs/limits.md).
MAX_MESSAGES = 2048
MAX_CONTENT_PARTS = 256
MAX_TEXT_CHARS = 10 * 2**20
MAX_STOP_SEQUENCES = 4
"""Stop strings (chat, completions, Messages' stop_sequences) and stop token ids: OpenAI's 4,
which vLLM's serving layer holds too (VLLM_MAX_STOP_STRINGS)."""
MAX_STOP_CHARS = 256
MAX_NAME_CHARS = 256
MAX_TOOLS = 128
MAX_LOGIT_BIAS = 300
MAX_TOKEN_LIST = MAX_LOGIT_BIAS
"""Token ids that mask the vocabulary (logit_bias, allowed_token_ids)."""
MAX_BAD_WORDS = 128
"""vLLM's own bound (VLLM_MAX_NUM_BAD_WORDS)."""
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
StopText = Annotated[str, Field(max_length=MAX_STOP_CHARS)]
StopTexts = Annotated[list[StopText], Field(max_length=MAX_STOP_SEQUENCES)]
# The engine's sampler takes a 64-bit seed; a larger one failed inside the engine as a 503.
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# More than any context; a larger count overflowed on its way to the engine (a 500).
TokenLimit = Annotated[int, Field(le=2**31 - 1)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
# A vocabulary's ids; a larger integer failed on its way to the engine (MessagePack: 64 bits).
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
JsonObject = dict[str, Any]
Structure = tuple[str, Literal["schema", "structured_outputs"], Any]
"""What a request makes the engine compile: (the field as its API names it, its kind, value);
held to app.limits.structure_bounds on every API."""

# Fields that only describe the caller or hint at caching: accepted, with nothing to honour.
CALLER_FIELDS = frozenset(
    {"user", "metadata", "service_tier", "safety_identifier", "prompt_cache_key"}
)
# vLLM's own extensions of the API that its serving layer honours (vLLM's docs, "Extra Parameters").
VLLM_FIELDS = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "allowed_token_ids",
        "bad_words",
        "prompt_logprobs",
        "echo",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "chat_template_kwargs",
        "structured_outputs",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "cache_salt",
        "documents",
        "repetition_detection",
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


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool = False
    continuous_usage_stats: bool = False


class ReplyLength(NamedTuple):
    """How long a request lets its reply run, on every API."""

    field: str
    """The field that bounds each reply: the one the client sent ("max_tokens",
    "max_completion_tokens", "max_output_tokens"), or where it sent none, the one the gateway
    sets to the plan's cap."""
    each: int | None
    """Its value, per choice (None: up to the end of the context, or what the plan leaves)."""
    choices: int = 1
    """The engine's sequences: choices times prompts."""

    @property
    def total(self) -> int | None:
        """The most the whole reply may generate: all choices, all prompts."""
        return None if self.each is None else self.each * self.choices


class GenerationFields(BaseModel):
    """The sampling fields /v1/chat/completions and /v1/completions share."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str = Field(max_length=256)
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    max_tokens: Annotated[TokenLimit, Field(ge=1)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    stop: StopText | StopTexts | None = None
    seed: Seed | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logit_bias: (
        Annotated[
            dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=MAX_LOGIT_BIAS)
        ]
        | None
    ) = None
    user: Name | None = None
    # vLLM's extensions, used by `vllm bench serve` and other vLLM-aware clients.
    ignore_eos: bool | None = None
    min_tokens: Annotated[TokenLimit, Field(ge=0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    allowed_token_ids: (
        Annotated[list[TokenId], Field(min_length=1, max_length=MAX_TOKEN_LIST)] | None
    ) = None
    bad_words: (
        Annotated[list[Annotated[StopText, Field(min_length=1)]], Field(max_length=MAX_BAD_WORDS)]
        | None
    ) = None

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

    def structures(self) -> Iterator[Structure]:
        """What the request makes the engine compile (app.limits.structure_bounds)."""
        extra = self.model_extra or {}
        if "structured_outputs" in extra:
            yield "structured_outputs", "structured_outputs", extra["structured_outputs"]

    @property
    def constrained(self) -> bool:
        """Decoding follows a grammar (vLLM's `structured_outputs`)."""
        return bool((self.model_extra or {}).get("structured_outputs"))

    def mask_on_a_grammar(self) -> tuple[str, str] | None:
        """A token mask that can leave a grammar no token it accepts; vLLM then fails the
        request inside the engine (its grammar rejects the token it had to sample)."""
        for name in GRAMMAR_MASKS:
            if getattr(self, name):
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
