"""A /v1/chat/completions request as the pipeline serves it."""

from __future__ import annotations

from app.apis.chat import continuation
from app.apis.chat.protocol import ChatCompletionRequest
from app.openai.protocol import ReplyLength
from app.serving.calls import RelayedCall
from app.serving.checks import check_reasoning, check_tools
from app.serving.continuation import Continue
from deployments.wire import Api, ModelInfo


class ChatCall(RelayedCall):
    api = Api.CHAT
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

    def resume(self, payload: dict, model: ModelInfo) -> Continue:
        return continuation.resume(self.body, payload, model)
