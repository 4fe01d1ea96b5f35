"""Every model type's endpoint by name (app.serving.dispatch): a request's `model` resolved
to its type (aliases, scopes), the types' readiness, and what their endpoints do together."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Collection, Mapping, Sequence

from ray.serve.handle import DeploymentHandle

from app.openai.errors import ApiError
from app.serving.dispatch import ORPHAN_CHECK_S, ModelEndpoint, unavailable
from deployments.ray_internals import scales_to_zero

logger = logging.getLogger("ray.serve.serviceai")


class ModelEndpoints:
    """Every model type's endpoint by name: resolves the `model` of a request to its endpoint
    (404 for an unknown one) and refuses types with no running replica."""

    def __init__(
        self,
        handles: Mapping[str, DeploymentHandle | ModelEndpoint],
        created: int,
        scale_to_zero: frozenset[str] | None = frozenset(),
        feed_min_streams: int = 0,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        """`scale_to_zero`: the types the config says scale to zero, or None where the config
        does not describe them (another application deploys them); Serve's word comes first.
        `aliases`: other names (or shell-style patterns) for the types, in order. A type
        given as an endpoint is served by it (app.serving.in_process)."""
        self.created = created
        self._aliases = dict(aliases or {})
        self._endpoints = {
            name: h if isinstance(h, ModelEndpoint) else ModelEndpoint(name, h, feed_min_streams)
            for name, h in handles.items()
        }
        self._scale_to_zero = scale_to_zero
        self._has_served: set[str] = set()

    @property
    def names(self) -> Sequence[str]:
        return list(self._endpoints)

    def get(self, model: str, scope: Collection[str] | None = None) -> ModelEndpoint:
        """The endpoint of a model type (by its name, an alias, or `Type:adapter` for one of
        its LoRA adapters, which the type's replicas say they hold), healthy or not; 404 for an
        unknown model, naming the models of `scope` (a key's, None: every type) that exist."""
        endpoint = self._endpoints.get(model) or self._aliased(model)
        if endpoint is None and ":" in model:
            endpoint = self._endpoints.get(model.partition(":")[0])
        if endpoint is None:
            available = [
                name
                for name in (self._endpoints if scope is None else sorted(scope))
                if name.partition(":")[0] in self._endpoints
            ]
            raise ApiError(
                404,
                f"The model '{model[:100]}' does not exist. "
                f"Available models: {', '.join(available) or 'none for this API key'}.",
                param="model",
                code="model_not_found",
            )
        return endpoint

    def _aliased(self, model: str) -> ModelEndpoint | None:
        target = self._aliases.get(model)
        if target is None:
            target = next(
                (t for alias, t in self._aliases.items() if fnmatch.fnmatchcase(model, alias)),
                None,
            )
        return None if target is None else self._endpoints.get(target)

    def resolve(self, model: str) -> ModelEndpoint:
        """The endpoint to dispatch to: 404 for an unknown model, 503 when it has no replica.

        A type that scales to zero is the exception: there a request is what starts a
        replica, so it waits for the cold start instead. So does a request while the handle
        has not heard the replicas or the config of its type.
        """
        endpoint = self.get(model)
        count = endpoint.running()
        if count == 0 and self._scales_to_zero(endpoint.name) is False:
            raise unavailable(endpoint.name)
        if count:
            self._has_served.add(endpoint.name)
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
        if endpoint.running() == 0:
            return None
        try:
            return (await endpoint.info()).max_model_len
        except ApiError:
            return None

    async def adapters(self, model: str) -> tuple[str, ...]:
        """A model type's LoRA adapters (`Type:adapter`); none while it has no replica."""
        endpoint = self.get(model)
        if endpoint.running() == 0:
            return ()
        try:
            return (await endpoint.info()).adapters
        except ApiError:
            return ()

    def refuse_orphans(self) -> None:
        """Refuse the calls waiting for a replica of a type that has none left and does not
        start one for a request (ModelEndpoint.refuse_waiting)."""
        for name, endpoint in self._endpoints.items():
            if not endpoint.has_waiting or endpoint.running() != 0:
                continue
            if self._scales_to_zero(name) is False:
                refused = endpoint.refuse_waiting()
                logger.warning("%s has no replica left: %d waiting requests refused", name, refused)

    async def refuse_orphans_periodically(self, every_s: float = ORPHAN_CHECK_S) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                self.refuse_orphans()
            except Exception as exc:  # a bug here must not stop the next rounds
                logger.error("Checking for requests without a replica failed: %r", exc)

    async def check_health(self) -> None:
        """Raise where an engine this process runs died (app.serving.in_process)."""
        for endpoint in self._endpoints.values():
            await endpoint.check_health()

    def local(self) -> list[ModelEndpoint]:
        """The endpoints whose engine runs in this process (app.serving.in_process)."""
        return [e for e in self._endpoints.values() if e.handle is None]

    def shutdown(self) -> None:
        for endpoint in self._endpoints.values():
            endpoint.shutdown()

    def readiness(self) -> dict[str, str]:
        """Per type: 'ready' (a replica runs, or it scales to zero and starts on demand),
        'pending' (no replica has run yet: its first one waits for a node that has the
        resources it asks for, or for its engine), 'unavailable' (it had replicas, none is
        left), or 'unknown' (the router has not heard from Serve yet)."""
        states = {}
        for name, endpoint in self._endpoints.items():
            count = endpoint.running()
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
