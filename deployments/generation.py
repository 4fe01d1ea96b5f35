"""The narrow interface between the ingress and a model deployment.

Plain, picklable types: they cross Ray on every request and every streamed message, so they
stay small, and this module imports nothing heavy (the ingress never imports vLLM).
The request is the OpenAI body as the ingress validated it; the reply is already encoded
by vLLM's serving layer, so the ingress relays bytes without decoding them.
"""

from __future__ import annotations

from typing import NamedTuple


class ReplyPart(NamedTuple):
    """The whole JSON body of a reply, or the SSE events ready since the last part; or, for
    a whole reply still in the engine, no data: its counts so far (what a client that
    leaves now is charged).

    The token counts are the engine's, for the whole request so far (all choices, all prompts).
    `ended` is set on a stream's last part only: 200, or the status of the error event that
    ended it. The ingress learns from it that the stream is complete before it writes the last
    events (a client may hang up the moment it reads `data: [DONE]`, as OpenAI's does).
    On a stream's first part, `replica` names the replica when it could open a feed to the
    ingress (deployments.feeds), and `via_feed` says that the rest comes on the open one.
    """

    data: bytes
    prompt_tokens: int
    completion_tokens: int
    ended: int | None = None
    replica: str | None = None
    via_feed: bool = False


class ModelInfo(NamedTuple):
    """What the ingress may tell clients (and check early) about a model type."""

    name: str
    max_model_len: int
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    template_tokens: int = 0
    """The tokens the chat template adds to a conversation with no text (see
    app.relay.check_prompt_length)."""


class GenerationError(Exception):
    """A failure the client should hear about, with the HTTP status and OpenAI code to use."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None
    param: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        # What the engine processed before the failure (the prompt once prefilled, tokens
        # made): the ingress charges it.
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def __reduce__(self):
        # Instances may carry a status, param or code of their own: keep them across Ray.
        return (_rebuild, (type(self), self.message, dict(vars(self))))


def _rebuild(cls: type[GenerationError], message: str, state: dict) -> GenerationError:
    error = cls(message)
    vars(error).update(state)
    return error


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
    type = "server_error"
    code = "model_unavailable"
