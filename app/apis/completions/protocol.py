"""POST /v1/completions (the legacy prompt completion) as the gateway checks it."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from app.openai.protocol import (
    MAX_CHOICES,
    MAX_MESSAGES,
    MAX_TEXT_CHARS,
    GenerationFields,
    Text,
)


class CompletionRequest(GenerationFields):
    """POST /v1/completions (the legacy prompt completion)."""

    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_MESSAGES)]
        | Annotated[list[int], Field(max_length=MAX_TEXT_CHARS)]
        | Annotated[
            list[Annotated[list[int], Field(max_length=MAX_TEXT_CHARS)]],
            Field(max_length=MAX_MESSAGES),
        ]
    )
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool | None = None

    def unsupported_field(self) -> tuple[str, str] | None:
        refused = super().unsupported_field() or (
            self.mask_on_a_grammar() if self.constrained else None
        )
        if refused is None and self.best_of is not None and self.best_of != self.choices:
            # vLLM 0.32 has no best_of: it would generate n and drop the field silently.
            return "best_of", (
                "best_of other than n is not supported: every candidate generated is "
                "returned; send n alone"
            )
        if (
            refused is None
            and self.echo
            and self.logprobs is not None
            and self.stream
            and (self.choices > 1)
        ):
            # vLLM 0.32's stream then fails: only one choice carries the prompt's logprobs.
            return "echo", (
                "echo with logprobs is not supported on a stream of more than one choice "
                "(n above 1): send stream false, n 1, or no logprobs"
            )
        return refused

    def to_engine(self) -> dict[str, Any]:
        """Less `best_of`, which can only equal n here and which vLLM does not know."""
        body = super().to_engine()
        body.pop("best_of", None)
        return body

    @property
    def reply_limit(self) -> int:
        """OpenAI's default for /v1/completions is 16 tokens."""
        return 16 if self.max_tokens is None else self.max_tokens

    @property
    def prompts(self) -> int:
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            return len(self.prompt)
        return 1
