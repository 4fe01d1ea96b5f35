"""What a model replica sends back for one /v1/responses request (plain, picklable, no vLLM)."""

from __future__ import annotations

from typing import NamedTuple

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsePart(NamedTuple):
    """A whole reply, or the server-sent events of a stream ready since the last part.

    `events` are encoded SSE events for the ingress to relay as they are. `final` is the JSON
    of the whole response object (a whole reply), or of the stream's terminal event (the last
    part of a stream), which the ingress stores before it sends it. Token counts are the
    engine's, for the request so far.
    """

    events: bytes
    final: bytes | None
    prompt_tokens: int
    completion_tokens: int
