"""What a /v1/messages request gives the pipeline: Anthropic's Messages API on the one path.

The replica's vLLM converts the request to chat and the reply back (deployments/vllm_engine/
messages.py); the ingress checks what the gateway must decide first (fields it cannot
honour, tools and thinking against the type) and frames a failure in a stream as Anthropic's
`error` event, as app.anthropic.envelope frames every other failure.
"""

from __future__ import annotations

import orjson

from app.anthropic import envelope
from app.apis.messages import continuation
from app.apis.messages.protocol import MessagesRequest
from app.openai.errors import ApiError
from app.openai.protocol import ReplyLength
from app.serving.calls import RelayedCall
from app.serving.checks import check_reasoning, check_tools
from app.serving.continuation import Continue
from deployments.wire import Api, ModelInfo

_TOOL_CHOICES = {None: None, "auto": "auto", "none": "none", "any": "required", "tool": "named"}


class MessagesCall(RelayedCall):
    api = Api.MESSAGES
    keepalive: bytes | None = b'event: ping\ndata: {"type": "ping"}\n\n'
    """Anthropic's stream sends `ping` while it waits; its SDKs skip it."""
    body: MessagesRequest

    def __init__(self, body: MessagesRequest) -> None:
        super().__init__(body)
        self.reply = ReplyLength("max_tokens", body.max_tokens)

    def check_against_model(self, model: ModelInfo) -> None:
        body = self.body
        choice = (body.tool_choice or {}).get("type")
        check_tools(model, body.tools, _TOOL_CHOICES.get(choice, choice))
        # An effort alone asks for no thinking (as on Anthropic's API; Claude Code sends one on
        # every turn): only `thinking` needs a type that reasons.
        check_reasoning(model, body.thinks, "thinking")

    def resume(self, payload: dict, model: ModelInfo) -> Continue:
        return continuation.resume(self.body, payload, model)

    def error_event(self, error: ApiError) -> bytes:
        """Anthropic's clients raise on an `error` event."""
        message = envelope.naming(error.message, error.param)
        body = envelope.error_body(envelope.status_of(error.status), message)
        return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"
