"""The Ray Serve ingress deployment: serves the FastAPI app, holds one handle per model type."""

from __future__ import annotations

import time

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from app.api import create_api
from app.auth import KeyVerifier
from app.config import ServiceConfig
from app.dispatch import ModelRouter
from app.keystore import open_store
from app.settings import get_settings


@serve.deployment
@serve.ingress()
class Ingress:
    async def __init__(
        self, config: ServiceConfig, models: dict[str, DeploymentHandle] | None
    ) -> None:
        self._settings = settings = get_settings()
        if models is None:
            models = {
                m.name: serve.get_deployment_handle(m.name, app_name=config.models_app)
                for m in config.model_types
            }
        self._router = ModelRouter(
            models, created=int(time.time()), scale_to_zero=config.scale_to_zero_types()
        )
        store = await open_store(settings)
        self._keys = KeyVerifier(
            store,
            ttl_s=settings.key_cache_ttl_s,
            max_entries=settings.key_cache_size,
            flush_every_s=settings.last_used_flush_s,
        )
        self._keys.start()

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_api(self._router, self._keys, self._settings.admin_token)

    async def __del__(self) -> None:
        """Serve's graceful shutdown: write the last-used times still in memory."""
        if hasattr(self, "_keys"):
            await self._keys.close()
            await self._keys.store.database.close()
