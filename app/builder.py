"""Builds the ServiceAi Serve application from the `args` of serve_config.yaml."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from app.config import ServiceConfig
from app.ingress import Ingress
from deployments.model_server import build_model_app, ensure_local_model


def build_app(args: dict[str, Any]) -> Application:
    """The import_path target: `app.builder:build_app`. A bad config fails here, naming the field."""
    config = ServiceConfig.model_validate(args)
    if config.models_app is not None:
        return Ingress.options(**config.ingress.serve_options()).bind(config, None)
    for model_type in config.model_types:
        ensure_local_model(model_type)
    models = {m.name: build_model_app(m) for m in config.model_types}
    return Ingress.options(**config.ingress.serve_options()).bind(config, models)
