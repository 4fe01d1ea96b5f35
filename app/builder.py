"""Builds the ServiceAi Serve applications from the `args` of a serve config.

Two import_path targets: `app.builder:build_app` (the ingress, with or without the model
types) and `app.builder:build_model_type` (one model type as an application of its own).
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from app.config.service import ServiceConfig
from app.ingress import Ingress
from deployments.model_server import build_model_app, build_model_type_app, ensure_local_model
from deployments.model_type import ModelTypeConfig


def build_app(args: dict[str, Any]) -> Application:
    """The ingress application. A bad config fails here, naming the field."""
    config = ServiceConfig.model_validate(args)
    ingress = Ingress.options(**config.ingress_options())  # type: ignore[attr-defined]
    if not config.deploys_model_types():
        return ingress.bind(config, None)
    for model_type in config.model_types:
        ensure_local_model(model_type)
    deployed = [m for m in config.model_types if not m.in_ingress]
    return ingress.bind(config, {m.name: build_model_app(m) for m in deployed})


def build_model_type(args: dict[str, Any]) -> Application:
    """One model type as its own application (no HTTP route); `args` is one model type entry.

    Its application must be named after the type: an ingress built with
    `separate_model_apps: true` looks it up there.
    """
    config = ModelTypeConfig.model_validate(args)
    if config.in_ingress:
        raise ValueError(
            f"{config.name} is in_ingress: its engine runs in an ingress (app.builder:build_app), "
            "not as an application of its own"
        )
    ensure_local_model(config)
    return build_model_type_app(config)
