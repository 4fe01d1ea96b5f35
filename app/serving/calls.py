"""/v1/chat/completions, /v1/completions and /v1/embeddings as `ApiCall`s of the pipeline.

Each relays the replica's bytes as they are (vLLM's serving layer encoded them); a broken
stream ends with OpenAI's `data: {"error": ...}` event and `data: [DONE]`.
"""

from __future__ import annotations

import orjson

from app.anthropic.messages import MessagesRequest
from app.limits.structure_bounds import check_structures, marked
from app.openai.chat import ChatCompletionRequest
from app.openai.completions import CompletionRequest
from app.openai.embeddings import EmbeddingRequest
from app.openai.errors import ApiError
from app.openai.protocol import GenerationFields, ReplyLength
from app.serving.pipeline import PROMPT_BYTES_BOUND, InputSize, check_reasoning, check_tools
from deployments.wire import ModelInfo, ReplyPart

DONE_EVENT = b"data: [DONE]\n\n"


class RelayedCall:
    """What chat, completions and messages share: a body checked here, refused fields named,
    and replies relayed as the replica encoded them."""

    api: str
    prompt_bytes = 0
    keepalive: bytes | None = None
    background = False
    inputs: InputSize | None = None

    def __init__(self, body: GenerationFields | MessagesRequest | EmbeddingRequest) -> None:
        self.body = body
        self.model = body.model
        self.stream = bool(body.stream)

    def check_fields(self) -> None:
        refused = self.body.unsupported_field()
        if refused is not None:
            name, reason = refused
            raise ApiError(400, reason, param=name, code="unsupported_parameter")
        check_structures(self.body.structures())

    async def prepare(self) -> None:
        pass

    def payload(self) -> dict:
        return marked(self.body.to_engine(), self.body.structures())

    async def whole(self, data: bytes) -> bytes:
        return data

    async def events(self, part: ReplyPart) -> bytes:
        return part.data

    def error_event(self, error: ApiError) -> bytes:
        """The client raises on a `data: {"error": ...}` event."""
        return b"data: " + orjson.dumps(error.body()) + b"\n\n" + DONE_EVENT


class ChatCall(RelayedCall):
    api = "chat"
    body: ChatCompletionRequest

    def __init__(self, body: ChatCompletionRequest) -> None:
        super().__init__(body)
        sent_old_name = body.max_completion_tokens is None and body.max_tokens is not None
        field = "max_tokens" if sent_old_name else "max_completion_tokens"
        self.reply = ReplyLength(field, body.reply_limit, body.choices)

    def check_against_model(self, model: ModelInfo) -> None:
        body = self.body
        check_tools(model, body.tools, body.tool_choice)
        check_reasoning(model, body.reasoning_effort is not None, "reasoning_effort")


class CompletionCall(RelayedCall):
    api = "completion"
    body: CompletionRequest

    def __init__(self, body: CompletionRequest) -> None:
        super().__init__(body)
        # Every prompt's every choice is one of the engine's sequences.
        self.reply = ReplyLength("max_tokens", body.reply_limit, body.choices * body.prompts)

    def check_against_model(self, model: ModelInfo) -> None:
        pass


SPECIAL_TOKENS_BOUND = 4
"""Most tokens a tokenizer adds to an input of its own (a BOS, an EOS, a separator)."""


class EmbeddingsCall(RelayedCall):
    """/v1/embeddings: a whole reply, no generation; its inputs held to the plan's bounds."""

    api = "embeddings"

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
