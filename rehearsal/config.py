"""The production serve config with the rehearsal's override applied: what `serve deploy` sends.

One source of truth: serve_config.production.yaml. rehearsal/override.yaml names only what a
machine without GPUs must change (the model, the engine, the sizes); every application, route,
proxy location, GPU and accelerator demand and placement strategy stays production's.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PRODUCTION_CONFIG = PROJECT_ROOT / "serve_config.production.yaml"
OVERRIDE = Path(__file__).with_name("override.yaml")
INGRESS_IMPORT_PATH = "app.builder:build_app"
# Replaced whole, not merged: production's GPU engine options mean nothing to a CPU engine.
REPLACED_KEYS = frozenset({"engine_args"})


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` merged in, mapping by mapping; REPLACED_KEYS are taken whole."""
    result = copy.deepcopy(base)
    for key, value in changes.items():
        if (
            isinstance(value, dict)
            and isinstance(result.get(key), dict)
            and key not in REPLACED_KEYS
        ):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def rehearsal_config(
    http_port: int,
    production: Path = PRODUCTION_CONFIG,
    override: Path = OVERRIDE,
    model_types: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The production config as the rehearsal cluster runs it, on `http_port`.

    `model_types` changes some types further (a rolling update changes one type's engine).
    """
    config = yaml.safe_load(production.read_text())
    changes = yaml.safe_load(override.read_text())
    config["http_options"] = merged(config["http_options"], changes.get("http_options", {}))
    config["http_options"]["port"] = http_port

    def model_type(args: dict[str, Any]) -> dict[str, Any]:
        args = merged(args, changes.get("every_model_type", {}))
        args = merged(args, changes.get("model_types", {}).get(args["name"], {}))
        return merged(args, (model_types or {}).get(args["name"], {}))

    for app in config["applications"]:
        if app["import_path"] == INGRESS_IMPORT_PATH:
            # Its model_types are names: a change to a type leaves the ingress's args alone.
            app["args"]["ingress"] = merged(app["args"]["ingress"], changes.get("ingress", {}))
        else:
            app["args"] = model_type(app["args"])
    return config


def write_rehearsal_config(path: Path, http_port: int, **kwargs: Any) -> Path:
    path.write_text(yaml.safe_dump(rehearsal_config(http_port, **kwargs), sort_keys=False))
    return path
