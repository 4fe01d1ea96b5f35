"""The narrow interface between the ingress and a model deployment.

Plain, picklable types: they cross Ray on every request and every streamed chunk, so they
stay small, and this module imports nothing heavy (the ingress never imports vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """How to sample; `max_tokens` None means up to the end of the context window."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    ignore_eos: bool = False
    min_tokens: int = 0


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One chat completion, already validated by the ingress. Messages are (role, text) pairs."""

    request_id: str
    messages: tuple[tuple[str, str], ...]
    sampling: SamplingOptions = field(default_factory=SamplingOptions)


class Delta(NamedTuple):
    """New text of one choice. In a completion it is the whole text of that choice."""

    index: int
    text: str
    token_count: int
    finish_reason: str | None


class GenerationChunk(NamedTuple):
    """One step of a stream, or (from `complete`) the whole result."""

    prompt_tokens: int
    deltas: tuple[Delta, ...]


class ModelInfo(NamedTuple):
    """What the ingress may tell clients about a model type; never the concrete model."""

    name: str
    max_model_len: int


class GenerationError(Exception):
    """A failure the client should hear about, with the HTTP status and OpenAI code to use."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None
    param: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ContextLengthExceeded(GenerationError):
    status = 400
    type = "invalid_request_error"
    code = "context_length_exceeded"
    param = "messages"


class InvalidGenerationRequest(GenerationError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class EngineUnavailable(GenerationError):
    status = 503
    type = "service_unavailable"
    code = "model_unavailable"
