"""A request whose replica or engine failed it goes on on another replica: nothing lost,
nothing repeated, no error for the client.

A failure that another replica can make good (`dispatch.ReplicaLost`: the engine died or
failed the request, the replica or its serving process died, the stream from it broke) is
tried again on another replica of the type, passing over those that failed it (the request
router's `AVOID`), at most `attempts` times (SERVICEAI_MIGRATION_ATTEMPTS), never for a
client that left (its task is cancelled first). What the client has seen decides how:

- nothing (a whole reply, or a stream before its first part): the request starts over;
- part of a stream: chat and completions continue. The new replica gets the prompt plus the
  text already sent (chat: as the assistant's message it continues, vLLM's
  `continue_final_message`; completions: after the prompt), the rest of the length budget
  and the same sampling; its events are rewritten to carry the first reply's id and creation
  time, without a second role chunk, and its usage counts the prompt once and every
  completion token the client received. The re-prefill is the service's cost.

A continuation would not be faithful, and the stream ends with its error as before, where
the reply holds more than text (`n` > 1, logprobs, tool calls, reasoning, structured output
half sent, `echo`, a suffix, a prompt of token ids) and on /v1/responses and /v1/messages
streams, whose events name their items (docs/operations.md). Each migration is logged and
counted (`serviceai_migrations` by model type, API and kind: `restart`, `continue`, or
`refused` with the reason logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from ray.util.metrics import Counter

from app.limits.ticket import Meter
from app.openai.errors import ApiError
from app.serving.dispatch import ModelEndpoint, PartStream, ReplicaLost
from deployments.ray_internals import running_replicas
from deployments.wire import ModelInfo, ReplyPart

logger = logging.getLogger("ray.serve.serviceai")

MIGRATIONS = Counter(
    "serviceai_migrations",
    description="Requests moved to another replica after theirs failed them, by model type, "
    "API and kind: `restart` (nothing was sent yet), `continue` (a stream went on from where "
    "it was cut), `refused` (a stream that could not go on faithfully: ended as before).",
    tag_keys=("model_type", "api", "kind"),
)


def moved(endpoint: ModelEndpoint, api: str, kind: str, lost: ReplicaLost, detail: str) -> None:
    MIGRATIONS.inc(tags={"model_type": endpoint.name, "api": api, "kind": kind})
    logger.warning(
        "Migration (%s) of a %s request on %s from replica %s: %s; %s",
        kind,
        api,
        endpoint.name,
        lost.replica or "unknown",
        lost.message,
        detail,
    )


class Attempts:
    """What one request may still try: `left` more replicas, passing over `avoid`."""

    __slots__ = ("left", "avoid")

    def __init__(self, left: int) -> None:
        self.left = left
        self.avoid: tuple[str, ...] = ()

    def take(self, lost: ReplicaLost, endpoint: ModelEndpoint) -> bool:
        """Whether the request may go on elsewhere after `lost` (an attempt is spent): not
        where the type runs no replica but those that failed it (a type of one replica whose
        engine died: Serve replaces it, and the client hears so rather than wait)."""
        avoid = self.avoid if lost.replica is None else (*self.avoid, lost.replica)
        running = running_replicas(endpoint.handle)
        if self.left <= 0 or (running is not None and running <= len(avoid)):
            return False
        self.left -= 1
        self.avoid = avoid
        return True


async def whole_reply(
    endpoint: ModelEndpoint, api: str, payload: dict, meter: Meter, attempts: Attempts
) -> ReplyPart:
    """`endpoint.reply`, started over on another replica while one fails it: the client saw
    nothing, and is charged only what the reply it gets cost."""
    while True:
        try:
            return await endpoint.reply(api, payload, meter, attempts.avoid)
        except ReplicaLost as lost:
            if not attempts.take(lost, endpoint):
                raise
            meter.reset()
            moved(endpoint, api, "restart", lost, "a whole reply, started over")


async def open_stream(
    endpoint: ModelEndpoint, api: str, payload: dict, meter: Meter, attempts: Attempts
) -> tuple[ReplyPart, PartStream]:
    """`endpoint.open_stream`, started over on another replica while one fails it before the
    stream's first part."""
    while True:
        try:
            return await endpoint.open_stream(api, payload, meter, attempts.avoid)
        except ReplicaLost as lost:
            if not attempts.take(lost, endpoint):
                raise
            meter.reset()
            moved(endpoint, api, "restart", lost, "a stream before its first part, started over")


Continue = Callable[[list[bytes], int], "Continuation | str"]
"""What an API does with a stream cut after the events `sent` (their bytes, as relayed) and
`received` completion tokens: the continuation, or why there is none."""


class Continuation:
    """How a cut stream goes on: the payload that continues it, and the new replica's parts
    as the client must see them (the first reply's id, creation time and counts)."""

    def __init__(self, payload: dict, sent: list[bytes], received: int) -> None:
        self.payload = payload
        self.received = received
        self.prompt_tokens = 0  # the first reply's prompt: set by the stream that goes on
        self._id, self._created = first_identity(sent)
        self._opened = False

    def part(self, part: ReplyPart) -> ReplyPart:
        """A part of the new replica's stream as the first replica's would have been."""
        events = []
        for event in sse_events(part.data):
            if event == b"[DONE]":
                events.append(b"data: [DONE]\n\n")
                continue
            chunk = orjson.loads(event)
            if self._keep(chunk):
                events.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
        return part._replace(
            data=b"".join(events),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.received + part.completion_tokens,
        )

    def _keep(self, chunk: dict[str, Any]) -> bool:
        chunk["id"], chunk["created"] = self._id, self._created
        usage = chunk.get("usage")
        if usage:
            usage["prompt_tokens"] = self.prompt_tokens
            usage["completion_tokens"] = self.received + usage.get("completion_tokens", 0)
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            details = usage.get("prompt_tokens_details")
            if details and details.get("cached_tokens"):
                details["cached_tokens"] = min(details["cached_tokens"], self.prompt_tokens)
        if self._opened:
            return True
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if delta is not None and "role" in delta:
                # The new reply's opening chunk: the client had the role from the first one.
                self._opened = True
                del delta["role"]
                return bool(delta.get("content")) or choice.get("finish_reason") is not None
        self._opened = bool(chunk.get("choices"))
        return True


class ContinuedStream:
    """A stream's parts after its first, going on on another replica when its own fails it
    (`resume`: the continuation, or why there is none). A failure it cannot make good is
    raised as it came."""

    def __init__(
        self,
        endpoint: ModelEndpoint,
        api: str,
        first: ReplyPart,
        parts: PartStream,
        meter: Meter,
        attempts: Attempts,
        resume: Continue,
    ) -> None:
        self._endpoint = endpoint
        self._api = api
        self._parts = parts
        self._meter = meter
        self._attempts = attempts
        self._resume = resume
        self._sent = [first.data]
        self._last = first
        self._prompt_tokens = first.prompt_tokens
        self._continuation: Continuation | None = None
        self._opening: ReplyPart | None = None

    def __aiter__(self) -> ContinuedStream:
        return self

    async def __anext__(self) -> ReplyPart:
        while self._opening is None:
            try:
                part = await anext(self._parts)
            except StopAsyncIteration:
                if self._last.last:
                    raise
                if not await self._went_on(self._endpoint.error(EOFError("cut short"))):
                    raise
                continue
            except Exception as exc:
                if not await self._went_on(self._endpoint.error(exc)):
                    raise
                continue
            if self._continuation is not None:
                part = self._continuation.part(part)
            return self._sending(part)
        part, self._opening = self._opening, None
        return self._sending(part)

    def _sending(self, part: ReplyPart) -> ReplyPart:
        self._sent.append(part.data)
        self._last = part
        return part

    async def _went_on(self, lost: ApiError) -> bool:
        """Whether the stream went on on another replica after `lost` (its first part is
        next); False where it cannot (the failure is raised as it came)."""
        if not isinstance(lost, ReplicaLost) or not self._attempts.take(lost, self._endpoint):
            return False
        received = self._last.completion_tokens
        continuation = self._resume(self._sent, received)
        if isinstance(continuation, str):
            moved(self._endpoint, self._api, "refused", lost, continuation)
            return False
        continuation.prompt_tokens = self._prompt_tokens
        cut = time.perf_counter()
        try:
            first, self._parts = await open_stream(
                self._endpoint, self._api, continuation.payload, self._meter, self._attempts
            )
        finally:
            self._meter.reset(self._last)  # the client is charged what it receives
        self._continuation = continuation
        self._opening = continuation.part(first)
        moved(
            self._endpoint,
            self._api,
            "continue",
            lost,
            f"went on after {received} tokens, {1000 * (time.perf_counter() - cut):.0f} ms later",
        )
        return True

    def cancel(self) -> None:
        self._parts.cancel()


def resume_of(api: str, payload: dict, model: ModelInfo) -> Continue:
    """How a cut stream of `api` goes on, or why it cannot (always, or once its events show
    more than text)."""
    if api == "chat":
        refusal = chat_refusal(payload, model)
        return _refused(refusal) if refusal else lambda sent, n: chat_continuation(payload, sent, n)
    if api == "completion":
        refusal = completion_refusal(payload)
        if refusal:
            return _refused(refusal)
        return lambda sent, n: completion_continuation(payload, sent, n)
    return _refused(f"a {api} stream's events name its items: it is not continued")


def _refused(reason: str) -> Continue:
    return lambda sent, received: reason


def chat_refusal(payload: dict, model: ModelInfo) -> str | None:
    """Why no chat stream of `payload` can go on elsewhere faithfully, or None."""
    if model.reasoning_parser:
        return "a reasoning model's reply (its reasoning is parsed from the whole output)"
    if payload.get("tools") and payload.get("tool_choice") != "none":
        return "a reply that may call tools"
    format_type = (payload.get("response_format") or {}).get("type", "text")
    return _common_refusal(payload) or (
        "structured output half sent" if format_type != "text" else None
    )


def completion_refusal(payload: dict) -> str | None:
    """Why no completion stream of `payload` can go on elsewhere faithfully, or None."""
    prompt = payload.get("prompt")
    if not isinstance(prompt, str) and not (
        isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
    ):
        return "a prompt of token ids, or several prompts"
    if payload.get("suffix"):
        return "a suffix"
    return _common_refusal(payload)


def _common_refusal(payload: dict) -> str | None:
    if (payload.get("n") or 1) > 1:
        return "n > 1"
    if payload.get("logprobs") or payload.get("top_logprobs") or payload.get("prompt_logprobs"):
        return "logprobs"
    if payload.get("echo"):
        return "echo"
    if payload.get("structured_outputs"):
        return "structured output half sent"
    return None


def chat_continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The chat request that goes on from the text `sent` (the assistant's message to
    continue), or why there is none (the reply held more than text)."""
    text = []
    for chunk in chunks(sent):
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("tool_calls") or delta.get("reasoning") or delta.get("reasoning_content"):
                return "a reply that holds tool calls or reasoning"
            if choice.get("finish_reason") is not None:
                return "a reply already finished"
            text.append(delta.get("content") or "")
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    said = "".join(text)
    messages = list(payload["messages"])
    if payload.get("continue_final_message"):
        last = messages[-1]
        if not isinstance(last.get("content"), str):
            return "a final message of parts to continue"
        messages[-1] = {**last, "content": last["content"] + said}
    elif said:
        messages.append({"role": "assistant", "content": said})
        body["add_generation_prompt"] = False
        body["continue_final_message"] = True
    body["messages"] = messages
    return Continuation(body, sent, received)


def completion_continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The completion request that goes on from the text `sent`, after its prompt."""
    text = []
    for chunk in chunks(sent):
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason") is not None:
                return "a reply already finished"
            text.append(choice.get("text") or "")
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    prompt = payload["prompt"]
    body["prompt"] = (prompt if isinstance(prompt, str) else prompt[0]) + "".join(text)
    return Continuation(body, sent, received)


def shortened(payload: dict, received: int) -> dict | str:
    """`payload` with `received` tokens less to generate (and to generate at least)."""
    body = dict(payload)
    for field in ("max_tokens", "max_completion_tokens"):
        if body.get(field) is not None:
            body[field] -= received
            if body[field] <= 0:
                return "a reply whose length budget is spent"
    if body.get("min_tokens"):
        body["min_tokens"] = max(0, body["min_tokens"] - received)
    return body


def chunks(sent: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(e) for data in sent for e in sse_events(data) if e != b"[DONE]"]


def sse_events(data: bytes) -> list[bytes]:
    """The `data:` payloads of the server-sent events in `data`."""
    return [
        line[6:] if line.startswith(b"data: ") else line[5:]
        for line in data.split(b"\n")
        if line.startswith(b"data:")
    ]


def first_identity(sent: list[bytes]) -> tuple[str, int]:
    """The id and creation time of the reply whose events `sent` holds."""
    for data in sent:
        for event in sse_events(data):
            if event != b"[DONE]":
                chunk = orjson.loads(event)
                return chunk["id"], chunk["created"]
    raise ValueError("no event sent yet")
