"""The Ray Serve ingress deployment: serves the FastAPI app, holds one handle per model type."""

from __future__ import annotations

import time

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from app.api import create_api
from app.auth import DevKeyVerifier
from app.config import ServiceConfig
from app.dispatch import ModelRouter
from app.settings import get_settings


@serve.deployment
@serve.ingress()
class Ingress:
    async def __init__(
        self, config: ServiceConfig, models: dict[str, DeploymentHandle] | None
    ) -> None:
        settings = get_settings()
        if models is None:
            models = {
                m.name: serve.get_deployment_handle(m.name, app_name=config.models_app)
                for m in config.model_types
            }
        self._router = ModelRouter(
            models, created=int(time.time()), scale_to_zero=config.scale_to_zero_types()
        )
        dev_key = settings.dev_api_key.get_secret_value() if settings.dev_api_key else None
        self._keys = DevKeyVerifier(dev_key)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_api(self._router, self._keys)
