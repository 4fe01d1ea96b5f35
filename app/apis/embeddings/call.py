"""A /v1/embeddings request as the pipeline serves it: a whole reply, no generation."""

from __future__ import annotations

from app.apis.embeddings.protocol import EmbeddingRequest
from app.openai.protocol import ReplyLength
from app.serving.calls import RelayedCall
from app.serving.checks import PROMPT_BYTES_BOUND, InputSize
from deployments.wire import Api, ModelInfo

SPECIAL_TOKENS_BOUND = 4
"""Most tokens a tokenizer adds to an input of its own (a BOS, an EOS, a separator)."""


class EmbeddingsCall(RelayedCall):
    """/v1/embeddings: a whole reply, no generation; its inputs held to the plan's bounds."""

    api = Api.EMBEDDINGS

    def __init__(self, body: EmbeddingRequest) -> None:
        super().__init__(body)
        # Nothing is generated; admission still reserves a token (a window with none left
        # refuses), replaced by the inputs' tokens when it is charged.
        self.reply = ReplyLength("input", 1)
        self.inputs = input_size(body.inputs)

    def check_against_model(self, model: ModelInfo) -> None:
        pass


def input_size(inputs: list[str] | list[list[int]]) -> InputSize:
    """How many inputs, and at most how many tokens (exact for token ids; a text's bound as
    `check_prompt_length` reckons a prompt's)."""
    if inputs and isinstance(inputs[0], list):
        lengths = [len(i) for i in inputs]
        return InputSize(len(lengths), sum(lengths), max(lengths), exact=True)
    bounds = [
        PROMPT_BYTES_BOUND * len(text.encode()) + SPECIAL_TOKENS_BOUND  # type: ignore[union-attr]
        for text in inputs
    ]
    return InputSize(len(bounds), sum(bounds), max(bounds), exact=False)
