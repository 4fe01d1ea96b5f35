"""/v1/chat/completions and /v1/completions as `ApiCall`s of the pipeline.

Both relay the replica's bytes as they are (vLLM's serving layer encoded them) and end a broken
stream with OpenAI's `data: {"error": ...}` event and `data: [DONE]`.
"""

from __future__ import annotations

import orjson

from app.anthropic.messages import MessagesRequest
from app.openai.chat import ChatCompletionRequest
from app.openai.completions import CompletionRequest
from app.openai.errors import ApiError
from app.openai.protocol import GenerationFields, ReplyLength
from app.serving.pipeline import check_reasoning, check_tools
from deployments.wire import ModelInfo, ReplyPart

DONE_EVENT = b"data: [DONE]\n\n"


class RelayedCall:
    """What chat, completions and messages share: a body checked here, refused fields named,
    and replies relayed as the replica encoded them."""

    api: str
    prompt_bytes = 0
    keepalive: bytes | None = None
    background = False

    def __init__(self, body: GenerationFields | MessagesRequest) -> None:
        self.body = body
        self.model = body.model
        self.stream = bool(body.stream)

    def check_fields(self) -> None:
        refused = self.body.unsupported_field()
        if refused is not None:
            name, reason = refused
            raise ApiError(400, reason, param=name, code="unsupported_parameter")

    async def prepare(self) -> None:
        pass

    def payload(self) -> dict:
        return self.body.to_engine()

    async def whole(self, data: bytes) -> bytes:
        return data

    async def events(self, part: ReplyPart) -> bytes:
        return part.data

    def error_event(self, error: ApiError) -> bytes:
        """The client raises on a `data: {"error": ...}` event."""
        return b"data: " + orjson.dumps(error.body()) + b"\n\n" + DONE_EVENT


class ChatCall(RelayedCall):
    api = "chat"

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

    def __init__(self, body: CompletionRequest) -> None:
        super().__init__(body)
        # Every prompt's every choice is one of the engine's sequences.
        self.reply = ReplyLength("max_tokens", body.reply_limit, body.choices * body.prompts)

    def check_against_model(self, model: ModelInfo) -> None:
        pass
