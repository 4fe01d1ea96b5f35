"""The FastAPI application: routes, error envelope and the state they share."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from app.dispatch import ModelRouter
from app.errors import install_error_handlers
from app.routes import chat, health
from app.routes import models as model_routes


def create_api(models: ModelRouter, keys: Any) -> FastAPI:
    """Build the HTTP API around a model router and a key verifier."""
    api = FastAPI(
        title="ServiceAi",
        summary="OpenAI-compatible chat completions over logical model types.",
        version="1.0.0",
    )
    api.state.models = models
    api.state.keys = keys
    install_error_handlers(api)
    api.include_router(health.router)
    api.include_router(model_routes.router)
    api.include_router(chat.router)
    return api
