"""How a stream cut by a failed replica goes on on another (app.serving.migration): what every
API's continuation shares. Each API says in its own folder (app/apis/<api>/continuation.py)
which of its fields leave a reply continuable, why one cannot go on, and the request that
continues one; a field it does not classify makes a reply not continuable."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import orjson

from deployments.wire import ReplyPart

Continue = Callable[[list[bytes], int], "Continuation | str"]
"""What an API does with a stream cut after the events `sent` (their bytes, as relayed) and
`received` completion tokens: the continuation, or why there is none."""


class Continuation:
    """How a cut stream goes on: the payload that continues it, and the new replica's parts
    as the client must see them (one reply: the first's identity, counts and events)."""

    def __init__(self, payload: dict, received: int) -> None:
        self.payload = payload
        self.received = received
        self.prompt_tokens = 0  # the first reply's prompt: set by the stream that goes on

    def part(self, part: ReplyPart) -> ReplyPart:
        """A part of the new replica's stream as the first replica's would have been."""
        data = b"".join(self.event(name, data) for name, data in sse_blocks(part.data))
        return part._replace(
            data=data,
            final=None if part.final is None else orjson.dumps(self.rewritten(part.final)),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.received + part.completion_tokens,
        )

    def event(self, name: bytes | None, data: bytes) -> bytes:
        """One event of the new stream as the client gets it (b"" for none)."""
        if data == b"[DONE]":
            return b"data: [DONE]\n\n"
        event = self.kept(orjson.loads(data))
        if event is None:
            return b""
        head = b"event: " + name + b"\n" if name is not None else b""
        return head + b"data: " + orjson.dumps(event) + b"\n\n"

    def kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        raise NotImplementedError

    def rewritten(self, final: bytes) -> dict[str, Any]:
        """A /v1/responses stream's terminal event (held apart: the ingress stores it)."""
        raise NotImplementedError

    def usage(self, usage: dict[str, Any] | None, prompt: str, completion: str, total: str) -> None:
        """The reply's usage as one reply's: the first prompt, every completion token."""
        if not usage:
            return
        usage[prompt] = self.prompt_tokens
        usage[completion] = self.received + (usage.get(completion) or 0)
        if total:
            usage[total] = usage[prompt] + usage[completion]
        for details in (usage.get("prompt_tokens_details"), usage.get("input_tokens_details")):
            if details and details.get("cached_tokens"):
                details["cached_tokens"] = min(details["cached_tokens"], self.prompt_tokens)


def resumable(
    reason: str | None, go_on: Callable[[list[bytes], int], Continuation | str]
) -> Continue:
    """`go_on` where there is no `reason` why the stream cannot go on, else that reason."""
    if reason is not None:
        return lambda sent, received: reason
    return go_on


def unclassified(fields_set: Collection[str], classified: Collection[str]) -> str | None:
    """Why a request whose client set `fields_set` cannot go on: the first field its API has
    not classified (a new field, until its API says what it does to a continuation)."""
    unknown = sorted(set(fields_set) - set(classified))
    return f"{unknown[0]}, a field whose continuation is unknown" if unknown else None


def shortened(payload: dict, received: int) -> dict | str:
    """`payload` with `received` tokens less to generate (and to generate at least)."""
    body = dict(payload)
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if body.get(field) is not None:
            body[field] -= received
            if body[field] <= 0:
                return "a reply whose length budget is spent"
    if body.get("min_tokens"):
        body["min_tokens"] = max(0, body["min_tokens"] - received)
    return body


def chunks(sent: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(e) for data in sent for e in sse_events(data) if e != b"[DONE]"]


def sse_blocks(data: bytes) -> list[tuple[bytes | None, bytes]]:
    """The server-sent events in `data`: each one's `event:` name (None where it has none)
    and its `data:` payload."""
    blocks = []
    for block in data.split(b"\n\n"):
        name, payload = None, None
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip()
            elif line.startswith(b"data:"):
                payload = line[6:] if line.startswith(b"data: ") else line[5:]
        if payload is not None:
            blocks.append((name, payload))
    return blocks


def sse_events(data: bytes) -> list[bytes]:
    """The `data:` payloads of the server-sent events in `data`."""
    return [payload for _, payload in sse_blocks(data)]


def first_identity(sent: list[bytes]) -> tuple[str, int]:
    """The id and creation time of the reply whose events `sent` holds."""
    for data in sent:
        for event in sse_events(data):
            if event != b"[DONE]":
                chunk = orjson.loads(event)
                return chunk["id"], chunk["created"]
    raise ValueError("no event sent yet")
