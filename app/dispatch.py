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

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from app.errors import ApiError
from deployments.generation import GenerationChunk, GenerationError, GenerationRequest

logger = logging.getLogger("serviceai")

RETRY_AFTER_UNAVAILABLE_S = 5
RETRY_AFTER_OVERLOADED_S = 1
RECHECK_S = 0.5


class ModelEndpoint:
    """The handle of one model type, with the failures of a call turned into `ApiError`s."""

    def __init__(self, name: str, handle: DeploymentHandle) -> None:
        self.name = name
        self.handle = handle
        self._streaming = handle.options(stream=True)

    async def open_stream(
        self, request: GenerationRequest
    ) -> tuple[GenerationChunk, DeploymentResponseGenerator]:
        """Start a stream and wait for its first chunk, so that a refusal is still an HTTP status."""
        response = self._streaming.stream.remote(request)
        try:
            first = await response.__anext__()
        except StopAsyncIteration:
            raise self.error(EOFError("stream ended before the first token")) from None
        except BaseException as exc:
            response.cancel()
            if isinstance(exc, Exception):
                raise self.error(exc) from None
            raise
        return first, response

    async def complete(self, request: GenerationRequest) -> GenerationChunk:
        response = self.handle.complete.remote(request)
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()
            raise
        except Exception as exc:
            raise self.error(exc) from None

    def error(self, exc: BaseException) -> ApiError:
        """The API error for a failed call to this model type."""
        cause = getattr(exc, "cause", None) or exc
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
            return ApiError(
                503,
                f"{self.name} is at capacity: every replica and its queue are full. "
                f"Retry in {RETRY_AFTER_OVERLOADED_S} s.",
                type="server_error",
                code="model_overloaded",
                headers={"Retry-After": str(RETRY_AFTER_OVERLOADED_S)},
            )
        if isinstance(cause, (RayActorError, DeploymentUnavailableError, ReplicaUnavailableError)):
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


class ModelRouter:
    """Resolves the `model` of a request to its endpoint; knows which types are healthy."""

    def __init__(
        self,
        handles: Mapping[str, DeploymentHandle],
        created: int,
        scale_to_zero: frozenset[str] = frozenset(),
    ) -> None:
        self.created = created
        self._endpoints = {name: ModelEndpoint(name, h) for name, h in handles.items()}
        self._scale_to_zero = scale_to_zero
        self._unhealthy: frozenset[str] = frozenset()
        self._refreshed_at = 0.0
        self._refresh: asyncio.Task[None] | None = None

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

    async def resolve(self, model: str) -> ModelEndpoint:
        """The endpoint to dispatch to: 404 for an unknown model, 503 when none is healthy.

        Before refusing, a view older than RECHECK_S is refreshed, so a type that has just
        (re)started is served at once rather than after the next poll.
        """
        endpoint = self.get(model)
        if model in self._unhealthy:
            if time.monotonic() - self._refreshed_at > RECHECK_S:
                await self.refresh_health()
            if model in self._unhealthy:
                raise unavailable(model)
        return endpoint

    def unhealthy(self) -> frozenset[str]:
        return self._unhealthy

    async def refresh_health(self) -> None:
        """Read Serve's status once: a type with no running replica gets 503s at once.

        Types that scale to zero are the exception while they are not failing: there a
        request is what starts the replica, so it waits for the cold start instead.
        Concurrent callers share one read.
        """
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._read_status())
        await asyncio.shield(self._refresh)

    async def _read_status(self) -> None:
        try:
            status = await asyncio.to_thread(serve.status)
        except Exception as exc:  # the controller may be restarting; keep the last view
            logger.warning("Could not read Serve status: %r", exc)
            return
        self._refreshed_at = time.monotonic()
        self._unhealthy = frozenset(
            name
            for name, endpoint in self._endpoints.items()
            if _has_no_healthy_replica(status, endpoint.handle, name in self._scale_to_zero)
        )

    async def watch_health(self, period_s: float = 2.0) -> None:
        while True:
            await asyncio.sleep(period_s)
            await self.refresh_health()


def _has_no_healthy_replica(status: Any, handle: DeploymentHandle, scales_to_zero: bool) -> bool:
    app = status.applications.get(handle.app_name)
    deployment = app and app.deployments.get(handle.deployment_name)
    if deployment is None:
        return False
    if deployment.replica_states.get("RUNNING", 0) > 0:
        return False
    return not scales_to_zero or deployment.status in ("UNHEALTHY", "DEPLOY_FAILED")
