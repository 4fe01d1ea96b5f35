"""What the APIs whose replies are relayed as the replica encoded them share: chat,
completions, messages and embeddings (each API's own call: app/apis/<api>/call.py).

A body is checked here (its refused fields named, its structures bounded) and the replica's
bytes go to the client as they are (vLLM's serving layer encoded them); a broken stream ends
with OpenAI's `data: {"error": ...}` event and `data: [DONE]` unless the API frames its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import orjson
from fastapi import Response

from app.limits.structure_bounds import check_structures, marked
from app.limits.ticket import Ticket
from app.openai.errors import ApiError
from app.openai.protocol import Structure
from app.serving.checks import InputSize
from app.serving.continuation import Continue, resumable
from app.serving.migration import Failover
from deployments.wire import Api, ModelInfo, ReplyPart

DONE_EVENT = b"data: [DONE]\n\n"


class RelayedBody(Protocol):
    """A request body as an API's protocol validated it."""

    @property
    def model(self) -> str: ...

    @property
    def stream(self) -> bool | None: ...

    def unsupported_field(self) -> tuple[str, str] | None: ...

    def structures(self) -> Iterable[Structure]: ...

    def to_engine(self) -> dict[str, Any]: ...


class RelayedCall:
    """What chat, completions, messages and embeddings share: a body checked here, refused
    fields named, and replies relayed as the replica encoded them."""

    api: Api
    prompt_bytes = 0
    keepalive: bytes | None = None
    background = False
    inputs: InputSize | None = None

    def __init__(self, body: RelayedBody) -> None:
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

    def resume(self, payload: dict, model: ModelInfo) -> Continue:
        """How a cut stream goes on (the API's continuation rules), or why it cannot."""
        return resumable(f"a {self.api} request is not streamed", lambda sent, received: "")

    async def in_background(self, failover: Failover, ticket: Ticket) -> Response:
        raise NotImplementedError("only /v1/responses answers in the background")
