"""The Ray Serve ingress deployment: serves the FastAPI app, holds one handle per model type."""

from __future__ import annotations

import asyncio
import logging
import os
import time

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import open_store
from app.accounts.keystore.responses import ResponseStore
from app.config.service import ServiceConfig
from app.config.settings import get_settings
from app.console import mount_console, require_shared_secret
from app.http.app import create_api
from app.limits.admission import RateLimits
from app.limits.counters import open_counters
from app.limits.usage_journal import UsageJournal, default_folder
from app.limits.usage_meter import UsageMeter
from app.observability.metrics import InFlight
from app.periodic import PeriodicFlush
from app.serving.adapters import RegisteredAdapters
from app.serving.dispatch import ModelEndpoint
from app.serving.endpoints import ModelEndpoints
from app.serving.in_process import LocalEndpoint
from deployments import ray_internals
from deployments.garbage_collection import collect_less_often

logger = logging.getLogger("ray.serve.serviceai")

MODEL_APP_WAIT_S = 300.0


@serve.deployment
@serve.ingress()
class Ingress:
    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self, config: ServiceConfig, models: dict[str, DeploymentHandle] | None
    ) -> None:
        collect_less_often()
        ray_internals.check()
        self._settings = settings = get_settings()
        require_shared_secret(settings, config.ingress.most_replicas())
        endpoints: dict[str, DeploymentHandle | ModelEndpoint] = {}
        for m in config.model_types:  # in the config's order: /v1/models lists them so
            if m.in_ingress:
                endpoints[m.name] = await LocalEndpoint.start(m)
            elif models is not None:
                endpoints[m.name] = models[m.name]
            else:
                endpoints[m.name] = await model_type_handle(m.name, config.model_type_app(m.name))
        self._router = ModelEndpoints(
            endpoints,
            created=int(time.time()),
            scale_to_zero=config.scale_to_zero_types(),
            feed_min_streams=settings.stream_feed_min_streams,
            aliases=config.model_aliases,
        )
        store = await open_store(settings)
        self._keys = KeyVerifier(
            store,
            ttl_s=settings.key_cache_ttl_s,
            max_entries=settings.key_cache_size,
            flush_every_s=settings.last_used_flush_s,
        )
        self._keys.start()
        redis_url = settings.redis_url.get_secret_value() if settings.redis_url else None
        self._limits = RateLimits(
            config.plans,
            open_counters(
                redis_url, key_prefix=settings.redis_key_prefix, timeout_s=settings.redis_timeout_s
            ),
            fail_open=settings.rate_limit_fail_open,
            monthly_usage=store.monthly_tokens,
        )
        journal_folder = settings.usage_journal_dir or default_folder(
            settings.database_url.get_secret_value()
        )
        self._usage = UsageMeter(
            store, flush_every_s=settings.usage_flush_s, journal=UsageJournal(journal_folder)
        )
        self._usage.start()
        self._responses = ResponseStore(
            store.database,
            retention_s=settings.response_retention_s,
            max_bytes=settings.response_max_bytes,
            user_max_bytes=settings.response_user_max_bytes,
        )
        self._purge = PeriodicFlush(
            self._purge_expired, settings.response_purge_every_s, "the purge of expired responses"
        )
        self._purge.start()
        self._in_flight = InFlight()
        self._gauges = asyncio.get_running_loop().create_task(
            self._in_flight.publish_periodically()
        )
        self._orphans = asyncio.get_running_loop().create_task(
            self._router.refuse_orphans_periodically()
        )

    def __serve_build_asgi_app__(self) -> FastAPI:
        settings = self._settings
        api = create_api(
            self._router,
            self._keys,
            self._limits,
            self._usage,
            settings.admin_token if settings.admin_api else None,
            self._in_flight,
            max_body_bytes=settings.max_body_bytes,
            body_read_timeout_s=settings.body_read_timeout_s,
            cors_origins=settings.cors_origins,
            api_docs=settings.api_docs,
            response_store=self._responses,
            adapters=RegisteredAdapters(
                self._keys.store,
                ttl_s=settings.key_cache_ttl_s,
                roots=settings.adapter_roots,
                hub_ids=settings.adapter_hub_ids,
            ),
            migration_attempts=settings.migration_attempts,
        )
        mount_console(api, settings)
        return api

    async def check_health(self) -> None:
        """Serve's health check: fails where an engine this replica runs (a type `in_ingress`)
        died, so that Serve replaces the replica and the engine with it."""
        await self._router.check_health()

    async def running_requests(self) -> dict[str, int]:
        """Requests each engine in this replica still holds; tests use it to prove that
        aborts free the engine."""
        return {e.name: e.engine.running_requests() for e in self._router.local()}

    async def process_ids(self) -> tuple[int, dict[str, tuple[int, ...]]]:
        """This replica's pid and its engines' core pids; tests kill them to prove recovery."""
        return os.getpid(), {e.name: e.engine.core_pids() for e in self._router.local()}

    async def _purge_expired(self) -> None:
        purged = await self._responses.purge()
        if purged:
            logger.info("Purged %d expired stored responses", purged)

    async def __del__(self) -> None:
        """Serve's graceful shutdown: write the last-used times and usage still in memory."""
        if hasattr(self, "_gauges"):
            self._gauges.cancel()
        if hasattr(self, "_orphans"):
            self._orphans.cancel()
        if hasattr(self, "_purge"):
            await self._purge.stop()
        if hasattr(self, "_usage"):
            await self._limits.close()
            await self._usage.close()
        if hasattr(self, "_keys"):
            await self._keys.close()
            await self._keys.store.database.close()
        if hasattr(self, "_router"):
            self._router.shutdown()


async def model_type_handle(
    name: str, app_name: str, timeout_s: float = MODEL_APP_WAIT_S
) -> DeploymentHandle:
    """The handle of a model type that another application deploys.

    `serve deploy` builds the applications of one config side by side, so this ingress may
    start before the application it routes to exists; it waits for it rather than failing.
    """
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(_is_deployed, name, app_name):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"Model type {name} is not deployed: no deployment {name!r} in application "
                f"{app_name!r} after {timeout_s:.0f} s. Deploy that application or fix its name."
            )
        logger.info("Waiting for application %r to deploy model type %s", app_name, name)
        await asyncio.sleep(2)
    return serve.get_deployment_handle(name, app_name=app_name)


def _is_deployed(name: str, app_name: str) -> bool:
    app = serve.status().applications.get(app_name)
    return app is not None and name in app.deployments
