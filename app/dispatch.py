"""Dispatch to the model deployments: one Ray Serve handle per logical model type.

Maps what can go wrong on the far side of a handle (engine errors, dead replicas, full
queues, no healthy replica) to the API errors a client gets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from app.errors import ApiError
from app.feeds import INGRESS_ID, FeedLost, Feeds, StreamParts
from deployments.generation import GenerationError, ModelInfo, ReplyPart

logger = logging.getLogger("ray.serve.serviceai")

RETRY_AFTER_UNAVAILABLE_S = 5
RETRY_AFTER_OVERLOADED_S = 1
INFO_TTL_S = 30.0


class ModelEndpoint:
    """The handle of one model type, with the failures of a call turned into `ApiError`s."""

    def __init__(self, name: str, handle: DeploymentHandle, feed_min_streams: int = 0) -> None:
        self.name = name
        self.handle = handle
        # Our requests and chunks are plain dataclasses and tuples: C pickle instead of Serve's
        # default cloudpickle (a Python-level pickler, paid on every streamed chunk).
        self._whole = handle.options(request_serialization="pickle", response_serialization="pickle")
        self._streaming = self._whole.options(stream=True)
        self._feeds = Feeds(self._streaming, feed_min_streams)
        self._info: ModelInfo | None = None
        self._info_at = 0.0

    async def open_stream(
        self, api: str, body: dict
    ) -> tuple[ReplyPart, DeploymentResponseGenerator | StreamParts]:
        """Start a stream and wait for its first part, so that a refusal is still an HTTP status.

        `api` is the model server's method: "chat" or "completion". The rest of the stream
        comes on its own call, or on this ingress's feed from the replica (app.feeds).
        """
        feeds = self._feeds
        if feeds.enabled():
            key = feeds.next_key()
            response = self._streaming.stream.remote(api, body, INGRESS_ID, key)
        else:
            response = self._streaming.stream.remote(api, body)
        try:
            first = await response.__anext__()
        except StopAsyncIteration:
            raise self.error(EOFError("stream ended before the first token")) from None
        except BaseException as exc:
            response.cancel()
            if isinstance(exc, Exception):
                raise self.error(exc) from None
            raise
        if feeds.enabled():
            return first, feeds.opened(key, response, first)
        return first, response

    async def reply(self, api: str, body: dict) -> ReplyPart:
        """The whole reply of a request without `stream`: its JSON body and token counts."""
        response = self._whole.reply.remote(api, body)
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()
            raise
        except Exception as exc:
            raise self.error(exc) from None

    async def info(self) -> ModelInfo:
        """What the model type's replicas serve (context length, tool parser), asked again
        every `INFO_TTL_S`: a rollout that changes them is seen without restarting the ingress."""
        now = time.monotonic()
        if self._info is None or now - self._info_at > INFO_TTL_S:
            try:
                self._info = await self._whole.info.remote()
            except Exception as exc:
                if self._info is None:
                    raise self.error(exc) from None
                # No replica answers now: keep what the last one said until the next try.
            self._info_at = now
        return self._info

    def error(self, exc: BaseException) -> ApiError:
        """The API error for a failed call to this model type."""
        cause = getattr(exc, "cause", None) or exc
        if isinstance(cause, GenerationError):
            headers = (
                {"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)} if cause.status == 503 else None
            )
            error = ApiError(
                cause.status,
                cause.message,
                type=cause.type,
                param=cause.param,
                code=cause.code,
                headers=headers,
            )
            # What the engine processed before it failed, for the charge.
            error.engine_usage = (cause.prompt_tokens, cause.completion_tokens)
            return error
        if isinstance(cause, BackPressureError):
            return ApiError(
                503,
                f"{self.name} is at capacity: every replica and its queue are full. "
                f"Retry in {RETRY_AFTER_OVERLOADED_S} s.",
                type="server_error",
                code="model_overloaded",
                headers={"Retry-After": str(RETRY_AFTER_OVERLOADED_S)},
            )
        if isinstance(
            cause,
            (RayActorError, DeploymentUnavailableError, ReplicaUnavailableError, FeedLost),
        ):
            return unavailable(self.name)
        logger.error("Call to %s failed: %r", self.name, cause)
        return ApiError(
            500,
            f"{self.name} failed to process the request.",
            type="server_error",
            code="internal_error",
        )


def unavailable(name: str) -> ApiError:
    return ApiError(
        503,
        f"{name} has no healthy replica right now. Retry in {RETRY_AFTER_UNAVAILABLE_S} s.",
        type="server_error",
        code="model_unavailable",
        headers={"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)},
    )


def _asyncio_router(handle: DeploymentHandle) -> Any:
    """The router that holds what the controller long-polled to this handle; None before its
    first call or .options() (Ray 2.60's private layout)."""
    return getattr(getattr(handle, "_router", None), "_asyncio_router", None)


def running_replicas(handle: DeploymentHandle) -> int | None:
    """How many running replicas this handle's router knows of; None while it does not know yet.

    The router learns the replica set from the controller by long-poll, so this is current
    and free. Ray has no public accessor for it (serve.status() re-serialises the whole
    application, ~0.2 s of CPU per call), hence the private path, pinned by our exact Ray
    version and exercised by tests/e2e/test_stream_lifecycle.py.
    """
    router = _asyncio_router(handle)
    if router is None:
        return None
    if not router._deployment_available:
        return 0
    request_router = router._request_router
    if request_router is not None:
        return len(request_router._replica_id_set)
    known = router._running_replicas
    return None if known is None else len(known)


def scales_to_zero(handle: DeploymentHandle) -> bool | None:
    """Whether the deployment behind this handle may have no replica (autoscaling with
    min_replicas 0); None while the handle's router has not heard its config yet.

    The controller long-polls each deployment's config to every handle's router, so this
    follows the deployment's own application, even where this one's args do not describe it.
    Private path, as in running_replicas.
    """
    router = _asyncio_router(handle)
    if router is None:
        return None
    config = router._metrics_manager._deployment_config
    if config is None:
        return None
    autoscaling = config.autoscaling_config
    return autoscaling is not None and autoscaling.min_replicas == 0


class ModelRouter:
    """Resolves the `model` of a request to its endpoint; refuses types with no running replica."""

    def __init__(
        self,
        handles: Mapping[str, DeploymentHandle],
        created: int,
        scale_to_zero: frozenset[str] | None = frozenset(),
        feed_min_streams: int = 0,
    ) -> None:
        """`scale_to_zero`: the types the config says scale to zero, or None where the config
        does not describe them (another application deploys them); Serve's word comes first."""
        self.created = created
        self._endpoints = {
            name: ModelEndpoint(name, h, feed_min_streams) for name, h in handles.items()
        }
        self._scale_to_zero = scale_to_zero
        self._has_served: set[str] = set()

    @property
    def names(self) -> Sequence[str]:
        return list(self._endpoints)

    def get(self, model: str) -> ModelEndpoint:
        """The endpoint of a model type, healthy or not; 404 for an unknown model."""
        endpoint = self._endpoints.get(model)
        if endpoint is None:
            raise ApiError(
                404,
                f"The model '{model[:100]}' does not exist. "
                f"Available models: {', '.join(self._endpoints)}.",
                param="model",
                code="model_not_found",
            )
        return endpoint

    def resolve(self, model: str) -> ModelEndpoint:
        """The endpoint to dispatch to: 404 for an unknown model, 503 when it has no replica.

        A type that scales to zero is the exception: there a request is what starts a
        replica, so it waits for the cold start instead. So does a request while the handle
        has not heard the replicas or the config of its type.
        """
        endpoint = self.get(model)
        count = running_replicas(endpoint.handle)
        if count == 0 and self._scales_to_zero(model) is False:
            raise unavailable(model)
        if count:
            self._has_served.add(model)
        return endpoint

    def _scales_to_zero(self, model: str) -> bool | None:
        """Whether a type may have no replica: as Serve says, else as the config says; None
        while neither knows (a type of another application before its handle heard)."""
        known = scales_to_zero(self.get(model).handle)
        if known is not None or self._scale_to_zero is None:
            return known
        return model in self._scale_to_zero

    async def max_model_len(self, model: str) -> int | None:
        """The context length of a model type; None while it has no replica to ask."""
        endpoint = self.get(model)
        if running_replicas(endpoint.handle) == 0:
            return None
        try:
            return (await endpoint.info()).max_model_len
        except ApiError:
            return None

    def readiness(self) -> dict[str, str]:
        """Per type: 'ready' (a replica runs, or it scales to zero and starts on demand),
        'pending' (no replica has run yet: its first one waits for a node that has the
        resources it asks for, or for its engine), 'unavailable' (it had replicas, none is
        left), or 'unknown' (the router has not heard from Serve yet)."""
        states = {}
        for name, endpoint in self._endpoints.items():
            count = running_replicas(endpoint.handle)
            # A replica runs, or a request would start one; None: Serve has not said yet.
            serves = None if count is None else count > 0 or self._scales_to_zero(name)
            if serves is None:
                states[name] = "unknown"
            elif serves:
                states[name] = "ready"
                self._has_served.add(name)
            else:
                states[name] = "unavailable" if name in self._has_served else "pending"
        return states
