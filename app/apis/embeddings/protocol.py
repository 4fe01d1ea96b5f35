"""POST /v1/embeddings as the gateway checks it: OpenAI's inputs, formats and dimensions.

The embedding type's replica runs vLLM's own embedding handler, which tokenizes the inputs,
refuses one beyond the model's context, a token id beyond its vocabulary or `dimensions` it
was not trained for, and encodes the vectors. Every other field is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.openai.protocol import MAX_TEXT_CHARS, Name, Structure

MAX_INPUTS = 2048
"""OpenAI's own cap on a request's inputs; a plan may allow fewer (`inputs_per_request`)."""

SHAPES = "a string, a list of strings, a list of token ids, or a list of lists of token ids"


def openai_inputs(value: Any) -> Any:
    """`input` in one of OpenAI's shapes, none of it empty; a clear message for what is not
    (pydantic's own, for a union of four lists, names the wrong one)."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list):
        raise ValueError(f"input must be {SHAPES}")
    if not texts:
        raise ValueError("input must not be an empty list")
    if len(texts) > MAX_INPUTS:
        raise ValueError(f"input has {len(texts)} items; at most {MAX_INPUTS} are allowed")
    if all(isinstance(text, str) for text in texts):
        for index, text in enumerate(texts):
            where = "input" if texts is not value else f"input[{index}]"
            if not text:
                raise ValueError(f"{where} must not be an empty string")
            if len(text) > MAX_TEXT_CHARS:
                raise ValueError(f"{where} is longer than {MAX_TEXT_CHARS} characters")
        return value
    if _token_ids(value) or all(_token_ids(ids) for ids in value):
        return value
    raise ValueError(f"input must be {SHAPES}; token ids are whole numbers from 0, none empty")


def _token_ids(value: Any) -> bool:
    """A non-empty list of token ids (whole numbers from 0, not booleans)."""
    return (
        isinstance(value, list)
        and 0 < len(value) <= MAX_TEXT_CHARS
        and all(type(v) is int and v >= 0 for v in value)
    )


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings: `input` a string, strings, token ids, or lists of token ids."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str = Field(max_length=256)
    input: Annotated[
        str | list[str] | list[int] | list[list[int]], BeforeValidator(openai_inputs)
    ] = Field(description=f"The inputs: {SHAPES}.")
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: Name | None = None

    stream: ClassVar[bool] = False

    def structures(self) -> Iterator[Structure]:
        """An embedding constrains no decoding: nothing to compile."""
        return iter(())

    def unsupported_field(self) -> tuple[str, str] | None:
        """The first field that cannot be honoured, and why; None when every field can."""
        for name in self.model_extra or {}:
            return name, f"Unrecognized request argument supplied: {name}"
        return None

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs as a list, each a string or a list of token ids."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [value]
        return value  # type: ignore[return-value]

    def to_engine(self) -> dict[str, Any]:
        """The body vLLM's embedding handler gets: as sent, less the caller's `user`."""
        body = self.model_dump(exclude_unset=True)
        body.pop("user", None)
        return body


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(
        description="The vector; with encoding_format base64, its float32s (little-endian) in "
        "base64."
    )


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    """The reply: one embedding per input, in input order."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
