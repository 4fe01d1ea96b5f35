"""Ray Serve's private attributes that this service reads, all in one place, checked at start.

Ray has no public way to learn, from a handle, how many replicas of a deployment are running
or whether it scales to zero (`serve.status()` re-serialises the whole application, ~0.2 s of
CPU per call), nor when Serve gave a call a replica. The ingress (app.serving.dispatch) reads
them here. Each replica calls `check()` when it starts: a Ray whose internals moved fails
there, naming the attribute, instead of at run time in a log line. Pinned by the exact Ray
version in pyproject.toml; exercised by tests/e2e/test_stream_lifecycle.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.serve._private.request_router.request_router import RequestRouter
from ray.serve._private.router import AsyncioRouter, RouterMetricsManager, SingletonThreadRouter
from ray.serve.handle import DeploymentHandle, _DeploymentHandleBase, _DeploymentResponseBase

from deployments.attributes import attributes_set

DeploymentResponseBase = _DeploymentResponseBase
"""What a handle's call returns, whole or streamed."""

READ: dict[type, tuple[str, ...]] = {
    _DeploymentHandleBase: ("_router",),
    SingletonThreadRouter: ("_asyncio_router",),
    AsyncioRouter: (
        "_deployment_available",
        "_request_router",
        "_running_replicas",
        "_metrics_manager",
    ),
    RouterMetricsManager: ("_deployment_config",),
    RequestRouter: ("_replica_id_set",),
    _DeploymentResponseBase: ("_replica_result_future",),
}
"""The attributes read, by the class that sets them."""


def check() -> None:
    """Raise if a class no longer sets an attribute this module reads."""
    for cls, names in READ.items():
        known = attributes_set(cls)
        for name in names:
            if name not in known:
                raise RuntimeError(
                    f"Ray Serve's {cls.__module__}.{cls.__qualname__} no longer sets {name}, "
                    "which ServiceAi reads (deployments/ray_internals.py): this Ray is not the "
                    "version pyproject.toml pins."
                )


def when_assigned(response: DeploymentResponseBase, callback: Callable[[], None]) -> None:
    """Call `callback` once Serve gave the call a replica, or the call was cancelled."""
    response._replica_result_future.add_done_callback(lambda _: callback())


def _asyncio_router(handle: DeploymentHandle) -> Any:
    """The router that holds what the controller long-polled to this handle; None before its
    first call or .options()."""
    return getattr(getattr(handle, "_router", None), "_asyncio_router", None)


def running_replicas(handle: DeploymentHandle) -> int | None:
    """How many running replicas this handle's router knows of; None while it does not know
    yet. The router learns the replica set from the controller by long-poll, so this is
    current and free."""
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
    """
    router = _asyncio_router(handle)
    if router is None:
        return None
    config = router._metrics_manager._deployment_config
    if config is None:
        return None
    autoscaling = config.autoscaling_config
    return autoscaling is not None and autoscaling.min_replicas == 0
