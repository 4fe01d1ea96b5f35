"""The narrow interface between the ingress and a model deployment.

Plain, picklable types: they cross Ray on every request and every streamed message, so they
stay small, and this module imports nothing heavy (the ingress never imports vLLM).
A call names its API (`Api`) and carries the body as the ingress validated it; the reply is already encoded by vLLM's serving layer, so the ingress
relays bytes without decoding them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Api(StrEnum):
    """The APIs, as the ingress names them to a model replica. A member is its value: it
    crosses Ray as that string and compares equal to it."""

    CHAT = "chat"
    COMPLETION = "completion"
    RESPONSES = "responses"
    MESSAGES = "messages"
    EMBEDDINGS = "embeddings"

    @property
    def path(self) -> str:
        """Where a client calls it."""
        return API_PATHS[self]


API_PATHS = {
    Api.CHAT: "/v1/chat/completions",
    Api.COMPLETION: "/v1/completions",
    Api.RESPONSES: "/v1/responses",
    Api.MESSAGES: "/v1/messages",
    Api.EMBEDDINGS: "/v1/embeddings",
}


class ReplyPart(NamedTuple):
    """A piece of a reply, whatever the API (chat, completion, responses).

    `data` is what the ingress relays: a stream's server-sent events ready since the last part,
    or a piece of a whole reply's JSON body. A whole reply still in the engine sends parts with
    no data every second or so: its counts so far, what a client that leaves now is charged.
    The token counts are the engine's, for the whole request so far (all choices, all prompts).
    `last` marks the part that completes the reply: the ingress learns from it that the reply
    is complete before it writes the last bytes (a client may hang up the moment it reads
    `data: [DONE]`, as OpenAI's does). A failure is raised, never encoded: the ingress frames
    it as its API does. `final` is a /v1/responses stream's terminal event (its last part):
    the ingress stores the response it holds before it sends it.
    On a stream's first part, `replica` names the replica when it could open a feed to the ingress (deployments.feed_hub), and `via_feed` says that
    the rest comes on the open one.
    """

    data: bytes
    prompt_tokens: int
    completion_tokens: int
    last: bool = False
    final: bytes | None = None
    replica: str | None = None
    via_feed: bool = False


ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""A LoRA adapter's own name: clients call it as `Type:name` (configured or registered)."""

AVOID = "avoid"
"""The keyword of a model replica's `stream` and `reply` calls naming replicas (their ids) the
request router passes over, where it has others: those that failed this request before."""

ENGINE = "engine"
"""The key of a model replica's metadata (`record_replica_metadata`) that names the engine it
shares with the other replicas of its gang; the request router counts engines."""

ADAPTER_PATH = "serviceai_adapter_path"
"""The body field in which the ingress sends a registered adapter's path with a request that
names it: the replica loads it from there first, unless it holds it already, and takes the
field out before vLLM reads the body."""

GRAMMAR_PARAM = "serviceai_grammar_param"
"""The body field in which the ingress names the request's field whose grammar the engine
compiles (a schema, `structured_outputs`): the replica takes it out before vLLM reads the body,
and names that field if the engine could not compile the grammar."""


class ModelInfo(NamedTuple):
    """What the ingress may tell clients (and check early) about a model type."""

    name: str
    max_model_len: int
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    template_tokens: int = 0
    """The tokens the chat template adds to a conversation with no text (see
    app.serving.pipeline.check_prompt_length)."""
    priority_scheduling: bool = False
    """The engine orders requests by `priority` (the caller's plan's, set by the ingress)."""
    embedding: bool = False
    """An embedding model: it serves /v1/embeddings and no API that generates."""
    adapters: tuple[str, ...] = ()
    """The LoRA adapters its config holds, as clients name them (`Type:adapter`)."""
    lora: bool = False
    """Its engine takes LoRA adapters: those registered at run time too."""


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
        self.replica: str | None = None

    def __reduce__(self):
        # Instances may carry a status, param or code of their own: keep them across Ray.
        return (_rebuild, (type(self), self.message, dict(vars(self))))


def _rebuild(cls: type[GenerationError], message: str, state: dict) -> GenerationError:
    error = cls(message)
    vars(error).update(state)
    return error


class InvalidGenerationRequest(GenerationError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class EngineUnavailable(GenerationError):
    status = 503
    type = "server_error"
    code = "model_unavailable"


class EngineFailed(EngineUnavailable):
    """The engine died, or failed or dropped a request, or the process serving it did: the
    request may go on on another replica (app.serving.migration). `replica` names the one
    that failed it (a Serve replica's id)."""


class EndedInEngine(EngineFailed):
    """The engine ended the request with an error and no reason (vLLM's finish reason
    "error"): in this service's engines, a grammar its core could not compile, which the
    replica answers as a refusal when the ingress named the field it came from
    (GRAMMAR_PARAM); otherwise a failure like any other."""
