"""A request whose replica or engine failed it goes on on another replica: nothing lost,
nothing repeated, no error for the client.

A failure that another replica can make good (`dispatch.ReplicaLost`: the engine died or
failed the request, the replica or its serving process died, the stream from it broke) is
tried again on another replica of the type, passing over those that failed it (the request
router's `AVOID`), at most `attempts` times (SERVICEAI_MIGRATION_ATTEMPTS), never for a
client that left (its task is cancelled first). What the client has seen decides how:

- nothing (a whole reply, or a stream before its first part): the request starts over;
- part of a stream: it continues. The new replica gets the prompt plus the text already
  sent (chat: as the assistant's message it continues, vLLM's `continue_final_message`;
  Messages: as a final assistant message, Anthropic's prefill; Responses: as a final
  assistant message `in_progress`; completions: after the prompt), the rest of the length
  budget and the same sampling. Its events are rewritten as the first reply's: chat and
  completions keep the first id and creation time with no second role chunk; Messages no
  second `message_start` or opening of the text block; Responses the first response's id,
  creation time and message item, sequence numbers going on, and the done events' text
  whole. Its usage counts the prompt once and every completion token the client received.
  The re-prefill is the service's cost.

A continuation would not be faithful, and the stream ends with its error as before, where
the reply holds more than text (`n` > 1, logprobs, tool calls, reasoning, structured output
half sent, `echo`, a suffix, a prompt of token ids: docs/operations.md). Each migration is
logged and counted (`serviceai_migrations` by model type, API and kind: `restart`,
`continue`, or `refused` with the reason logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ray.util.metrics import Counter

from app.limits.ticket import Meter
from app.openai.errors import ApiError
from app.serving.continuation import Continuation, Continue
from app.serving.dispatch import ModelEndpoint, PartStream, ReplicaLost
from deployments.wire import Api, ReplyPart

logger = logging.getLogger("ray.serve.serviceai")
T = TypeVar("T")

MIGRATIONS = Counter(
    "serviceai_migrations",
    description="Requests moved to another replica after theirs failed them, by model type, "
    "API and kind: `restart` (nothing was sent yet), `continue` (a stream went on from where "
    "it was cut), `refused` (a stream that could not go on faithfully: ended as before).",
    tag_keys=("model_type", "api", "kind"),
)


def moved(endpoint: ModelEndpoint, api: Api, kind: str, lost: ReplicaLost, detail: str) -> None:
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
        running = endpoint.running()
        if self.left <= 0 or (running is not None and running <= len(avoid)):
            return False
        self.left -= 1
        self.avoid = avoid
        return True


class Failover:
    """One request's dispatch with failover, the one stage the pipeline calls: its reply from
    the type's endpoint, started over on another replica while one fails it before the client
    saw anything, and a stream that goes on from where it was cut (by the API's `resume`
    rules) once it did."""

    def __init__(self, endpoint: ModelEndpoint, api: Api, payload: dict, attempts: int) -> None:
        self.endpoint = endpoint
        self.api = api
        self.payload = payload
        self.attempts = Attempts(attempts)

    async def whole(self, meter: Meter) -> ReplyPart:
        """The whole reply (the client is charged what the reply it gets cost)."""
        return await whole_reply(self.endpoint, self.api, self.payload, meter, self.attempts)

    async def stream(self, meter: Meter, resume: Continue) -> tuple[ReplyPart, ContinuedStream]:
        """The stream's first part, and its parts after the first."""
        first, parts = await open_stream(
            self.endpoint, self.api, self.payload, meter, self.attempts
        )
        rest = ContinuedStream(self.endpoint, self.api, first, parts, meter, self.attempts, resume)
        return first, rest


async def whole_reply(
    endpoint: ModelEndpoint, api: Api, payload: dict, meter: Meter, attempts: Attempts
) -> ReplyPart:
    """`endpoint.reply`, started over on another replica while one fails it: the client saw
    nothing, and is charged only what the reply it gets cost."""
    return await _started_over(
        lambda avoid: endpoint.reply(api, payload, meter, avoid),
        endpoint,
        api,
        meter,
        attempts,
        "a whole reply, started over",
    )


async def open_stream(
    endpoint: ModelEndpoint, api: Api, payload: dict, meter: Meter, attempts: Attempts
) -> tuple[ReplyPart, PartStream]:
    """`endpoint.open_stream`, started over on another replica while one fails it before the
    stream's first part."""
    return await _started_over(
        lambda avoid: endpoint.open_stream(api, payload, meter, avoid),
        endpoint,
        api,
        meter,
        attempts,
        "a stream before its first part, started over",
    )


async def _started_over(
    call: Callable[[tuple[str, ...]], Awaitable[T]],
    endpoint: ModelEndpoint,
    api: Api,
    meter: Meter,
    attempts: Attempts,
    what: str,
) -> T:
    """`call` (given the replicas to pass over), again while a replica fails it and attempts
    are left; each failed try is charged nothing."""
    while True:
        try:
            return await call(attempts.avoid)
        except ReplicaLost as lost:
            if not attempts.take(lost, endpoint):
                raise
            meter.reset()
            moved(endpoint, api, "restart", lost, what)


class ContinuedStream:
    """A stream's parts after its first, going on on another replica when its own fails it
    (`resume`: the continuation, or why there is none). A failure it cannot make good is
    raised as it came."""

    def __init__(
        self,
        endpoint: ModelEndpoint,
        api: Api,
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
        # The prompt as last counted: a stream's first event can precede its prefill (a
        # Responses stream's `response.created` counts no prompt yet).
        continuation.prompt_tokens = self._last.prompt_tokens
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
