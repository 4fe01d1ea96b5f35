"""The local profile listens on this machine only: Serve's HTTP port and Ray's dashboard.

The running stack's listener is checked in tests/e2e/test_exposure.py; this checks what
`serviceai run` (which calls `serve run serve_config.yaml`) asks Ray for.
"""

from __future__ import annotations

import inspect

import ray
from ray.serve import scripts
from ray.serve.schema import ServeDeploySchema

from tests.deploy.conftest import LOCAL_SERVE_CONFIG, load

LOCALHOST = "127.0.0.1"


def test_serve_http_is_bound_to_localhost():
    config = ServeDeploySchema.model_validate(load(LOCAL_SERVE_CONFIG))
    assert config.http_options.host == LOCALHOST


def test_the_dashboard_of_the_local_cluster_is_bound_to_localhost():
    # `serve run` starts the local cluster with ray.init() and no dashboard_host of its own,
    # so the dashboard binds to ray.init's default; both facts are pinned to our Ray version.
    assert "dashboard_host" not in inspect.getsource(scripts.run.callback)
    assert inspect.signature(ray.init).parameters["dashboard_host"].default == LOCALHOST
