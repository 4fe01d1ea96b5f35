"""Dispatch to the model deployments: one Ray Serve handle per logical model type.

Maps what can go wrong on the far side of a handle (engine errors, dead replicas, full
queues, no healthy replica) to the API errors a client gets.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import AsyncIterator
from typing import TypeVar

from ray.exceptions import RayActorError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from app.limits.ticket import Meter
from app.openai.errors import ApiError
from app.serving.stream_feeds import INGRESS_ID, FeedLost, Feeds, StreamParts
from deployments.ray_internals import (
    DeploymentResponseBase,
    running_replicas,
    when_assigned,
)
from deployments.wire import AVOID, Api, EngineFailed, GenerationError, ModelInfo, ReplyPart

logger = logging.getLogger("ray.serve.serviceai")

RETRY_AFTER_UNAVAILABLE_S = 5
RETRY_AFTER_OVERLOADED_S = 1
INFO_TTL_S = 30.0
ORPHAN_CHECK_S = 1.0
_Response = TypeVar("_Response", bound=DeploymentResponseBase)
PartStream = DeploymentResponseGenerator | StreamParts
"""A stream's parts after its first: from its own call, or from a feed (app.serving.stream_feeds)."""


class ModelEndpoint:
    """The handle of one model type, with the failures of a call turned into `ApiError`s."""

    def __init__(self, name: str, handle: DeploymentHandle, feed_min_streams: int = 0) -> None:
        self.name = name
        self.handle = handle
        # Our requests and chunks are plain dataclasses and tuples: C pickle instead of Serve's
        # default cloudpickle (a Python-level pickler, paid on every streamed chunk).
        self._whole = handle.options(
            request_serialization="pickle", response_serialization="pickle"
        )
        self._streaming = self._whole.options(stream=True)
        self._feeds = Feeds(self._streaming, feed_min_streams)
        self._info: ModelInfo | None = None
        self._info_at = 0.0
        # Calls Serve has not yet given a replica (see refuse_waiting); the router's thread
        # removes them once assigned or cancelled.
        self._waiting: set[DeploymentResponseBase] = set()
        self._refused: weakref.WeakSet[DeploymentResponseBase] = weakref.WeakSet()

    async def open_stream(
        self, api: Api, body: dict, meter: Meter, avoid: tuple[str, ...] = ()
    ) -> tuple[ReplyPart, PartStream]:
        """Start a stream of `api` and wait for its first part, so that a refusal is still an
        HTTP status; its counts (or those its failure declares) go to `meter`. The rest of the
        stream comes on its own call, or on this ingress's feed from the replica
        (app.serving.stream_feeds). `avoid`: replicas that failed it before, passed over where
        there are others."""
        feeds = self._feeds
        passing = {AVOID: avoid} if avoid else {}
        if feeds.enabled():
            key = feeds.next_key()
            response = self._streaming.stream.remote(api, body, INGRESS_ID, key, **passing)
        else:
            response = self._streaming.stream.remote(api, body, **passing)
        self._track(response)
        try:
            first = await response.__anext__()
        except BaseException as exc:
            count_failure(exc, meter)
            if feeds.enabled():
                feeds.forget(key)
            if isinstance(exc, StopAsyncIteration):
                raise self.error(EOFError("stream ended before its first part")) from None
            raise self._failure(response, exc) from None
        meter.count(first)
        if feeds.enabled():
            return first, feeds.opened(key, response, first)
        return first, response

    async def reply(
        self, api: Api, body: dict, meter: Meter, avoid: tuple[str, ...] = ()
    ) -> ReplyPart:
        """The whole reply of a request of `api` without `stream`: its JSON body (joined from
        the parts that carry it) and the engine's token counts.

        Until the body comes, the replica sends the counts so far every second or so; each goes
        to `meter`, as do those a failure declares, so a call that fails or is cancelled (the
        client left) is charged what the engine processed.
        """
        passing = {AVOID: avoid} if avoid else {}
        response = self._track(self._streaming.reply.remote(api, body, **passing))
        try:
            whole = await joined(response, meter)
            if whole is None:
                raise EOFError("the reply ended without its body")
            return whole
        except BaseException as exc:
            count_failure(exc, meter)
            raise self._failure(response, exc) from None

    async def info(self) -> ModelInfo:
        """What the model type's replicas serve (context length, tool parser), asked again
        every `INFO_TTL_S`: a rollout that changes them is seen without restarting the ingress."""
        now = time.monotonic()
        if self._info is None or now - self._info_at > INFO_TTL_S:
            response = self._track(self._whole.info.remote())
            try:
                self._info = await response
            except Exception as exc:
                if self._info is None:
                    raise self._failure(response, exc) from None
                # No replica answers now: keep what the last one said until the next try.
            self._info_at = now
        return self._info

    async def prompt_tokens(self, api: Api, body: dict) -> int:
        """The prompt's length as a replica renders it for generation, nothing generated;
        a prompt the replica would refuse (beyond the context, say) is its `ApiError`."""
        response = self._track(self._whole.prompt_tokens.remote(api, body))
        try:
            return await response
        except BaseException as exc:
            raise self._failure(response, exc) from None

    def _track(self, response: _Response) -> _Response:
        """`response`, known as waiting until Serve gives it a replica (see refuse_waiting)."""
        waiting = self._waiting
        waiting.add(response)
        when_assigned(response, lambda: waiting.discard(response))
        return response

    def running(self) -> int | None:
        """How many replicas of the type run; None while Serve has not said."""
        return running_replicas(self.handle)

    async def check_health(self) -> None:
        """Raise where this process's own engine of the type died (app.serving.in_process)."""

    def shutdown(self) -> None:
        """Stop what this process runs of the type (app.serving.in_process)."""

    @property
    def has_waiting(self) -> bool:
        return bool(self._waiting)

    def refuse_waiting(self) -> int:
        """Refuse the calls that wait for a replica; how many there were.

        Serve's router holds a call until some replica takes it, however long that is: after
        a lost node, until a node that can host the type is back. Where the type has no
        replica left and will not start one for a request (it does not scale to zero), those
        calls get the 503 `model_unavailable` that a request arriving now gets.
        """
        refused = list(self._waiting)  # one C call: the router's thread cannot change it meanwhile
        for response in refused:
            self._refused.add(response)
            response.cancel()
        return len(refused)

    def _failure(self, response: DeploymentResponseBase, exc: BaseException) -> BaseException:
        """What to raise for a call that ended in `exc` (a cancel of this task is re-raised);
        the call is cancelled, if it still runs."""
        response.cancel()
        if response in self._refused:
            return unavailable(self.name)
        return self.error(exc) if isinstance(exc, Exception) else exc

    def error(self, exc: BaseException) -> ApiError:
        """The API error for a failed call to this model type: a `ReplicaLost` where the
        replica, its engine or the way to it failed (another replica may serve the request)."""
        cause = getattr(exc, "cause", None) or exc
        if isinstance(cause, EngineFailed):
            return ReplicaLost(
                cause.message, cause.replica, retry_after_s=RETRY_AFTER_UNAVAILABLE_S
            )
        if isinstance(cause, (RayActorError, ReplicaUnavailableError, FeedLost, EOFError)):
            # The replica died (Serve's router drops it at once) or the stream broke.
            lost = unavailable(self.name)
            return ReplicaLost(lost.message, None, retry_after_s=RETRY_AFTER_UNAVAILABLE_S)
        if isinstance(cause, GenerationError):
            headers = (
                {"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)} if cause.status == 503 else None
            )
            return ApiError(
                cause.status,
                cause.message,
                type=cause.type,
                param=cause.param,
                code=cause.code,
                headers=headers,
            )
        if isinstance(cause, BackPressureError):
            return overloaded(self.name)
        if isinstance(cause, DeploymentUnavailableError):
            return unavailable(self.name)
        logger.error("Call to %s failed: %r", self.name, cause)
        return ApiError(
            500,
            f"{self.name} failed to process the request.",
            type="server_error",
            code="internal_error",
        )


class ReplicaLost(ApiError):
    """A call that failed because its replica, its engine, or the stream from it did: a 503
    to retry, unless the request goes on on another replica (app.serving.migration).
    `replica` names the one that failed it, where known."""

    def __init__(self, message: str, replica: str | None, *, retry_after_s: int) -> None:
        super().__init__(
            503,
            message,
            type="server_error",
            code="model_unavailable",
            headers={"Retry-After": str(retry_after_s)},
        )
        self.replica = replica


async def joined(parts: AsyncIterator[ReplyPart], meter: Meter) -> ReplyPart | None:
    """A whole reply's last part with the body its parts carry, each part counted on `meter`;
    None where the parts end without it."""
    pieces: list[bytes] = []
    async for part in parts:
        meter.count(part)
        pieces.append(part.data)  # a large body comes in several parts
        if part.last:
            return part._replace(data=b"".join(pieces))
    return None


def count_failure(exc: BaseException, meter: Meter) -> None:
    """What the engine processed before a call failed, where the failure declares it."""
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, GenerationError):
        meter.count(cause)


def overloaded(name: str) -> ApiError:
    return ApiError(
        503,
        f"{name} is at capacity: every replica and its queue are full. "
        f"Retry in {RETRY_AFTER_OVERLOADED_S} s.",
        type="server_error",
        code="model_overloaded",
        headers={"Retry-After": str(RETRY_AFTER_OVERLOADED_S)},
    )


def unavailable(name: str) -> ApiError:
    return ApiError(
        503,
        f"{name} has no healthy replica right now. Retry in {RETRY_AFTER_UNAVAILABLE_S} s.",
        type="server_error",
        code="model_unavailable",
        headers={"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)},
    )
