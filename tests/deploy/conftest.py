"""The deployment files as Ray reads them. Nothing here starts Ray, vLLM or a GPU."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import PROJECT_ROOT

CLUSTER_CONFIG = PROJECT_ROOT / "cluster.yaml"
LOCAL_SERVE_CONFIG = PROJECT_ROOT / "serve_config.yaml"
PRODUCTION_SERVE_CONFIG = PROJECT_ROOT / "serve_config.production.yaml"
DEPLOY_GUIDE = PROJECT_ROOT / "docs" / "deploy.md"
SIZING_GUIDE = PROJECT_ROOT / "docs" / "sizing.md"


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@dataclass
class BuiltDeployment:
    """One deployment of a serve config, built the way the Serve controller builds it."""

    app: str
    deployment: Any  # ray.serve.Deployment, with Serve-validated options

    @property
    def name(self) -> str:
        return self.deployment.name

    @property
    def config(self) -> Any:
        return self.deployment._deployment_config

    @property
    def replica(self) -> Any:
        return self.deployment._replica_config

    def demand(self) -> dict[str, float]:
        """What one replica needs from one node: its actor, or its whole STRICT_PACK group."""
        bundles = self.replica.placement_group_bundles
        if not bundles:
            return dict(self.replica.resource_dict)
        assert self.replica.placement_group_strategy == "STRICT_PACK"
        total: dict[str, float] = {}
        for bundle in bundles:
            for resource, amount in bundle.items():
                total[resource] = total.get(resource, 0) + amount
        return total


def build_serve_config(path: Path) -> list[BuiltDeployment]:
    """Every deployment of every application, via Ray Serve's own schema, import and build."""
    from ray._common.utils import import_attr
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve._private.build_app import build_app
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(load(path))
    built = []
    for app in schema.applications:
        builder = import_attr(app.import_path)
        application = call_user_app_builder_with_args_if_necessary(builder, copy.deepcopy(app.args))
        for deployment in build_app(application, name=app.name).deployments:
            built.append(BuiltDeployment(app.name, deployment))
    return built


@pytest.fixture(scope="session")
def cluster() -> dict[str, Any]:
    return load(CLUSTER_CONFIG)


@pytest.fixture(scope="session")
def production() -> dict[str, Any]:
    return load(PRODUCTION_SERVE_CONFIG)


@pytest.fixture(scope="session")
def production_deployments() -> list[BuiltDeployment]:
    return build_serve_config(PRODUCTION_SERVE_CONFIG)
