"""A /v1/completions request as the pipeline serves it."""

from __future__ import annotations

from app.apis.completions import continuation
from app.apis.completions.protocol import CompletionRequest
from app.openai.protocol import ReplyLength
from app.serving.calls import RelayedCall
from app.serving.continuation import Continue
from deployments.wire import Api, ModelInfo


class CompletionCall(RelayedCall):
    api = Api.COMPLETION
    body: CompletionRequest

    def __init__(self, body: CompletionRequest) -> None:
        super().__init__(body)
        # Every prompt's every choice is one of the engine's sequences.
        self.reply = ReplyLength("max_tokens", body.reply_limit, body.choices * body.prompts)

    def check_against_model(self, model: ModelInfo) -> None:
        pass

    def resume(self, payload: dict, model: ModelInfo) -> Continue:
        return continuation.resume(self.body, payload, model)
