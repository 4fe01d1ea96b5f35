"""Fixtures shared by the whole suite. The real stack is started once per session, on demand."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SERVE_CONFIG = PROJECT_ROOT / "serve_config.yaml"
APP_NAME = "serviceai"
# Everything that starts Ray and vLLM on this 2-core machine takes this lock first, so that
# two test sessions (or a test session and `make bench`) never share the cores.
STACK_LOCK = Path(tempfile.gettempdir()) / "serviceai-stack.lock"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def app_args(config_path: Path = SERVE_CONFIG, name: str = APP_NAME) -> dict[str, Any]:
    """The `args` of application `name` in a serve config file."""
    config = yaml.safe_load(config_path.read_text())
    return next(a for a in config["applications"] if a["name"] == name)["args"]


@dataclass
class Stack:
    """A running ServiceAi: Ray Serve with the ingress and the three model types."""

    origin: str
    api_key: str
    ray_dir: Path

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def handle(self, deployment: str, app: str = APP_NAME):
        from ray import serve

        return serve.get_deployment_handle(deployment, app)

    def log_files(self) -> list[Path]:
        return [p for p in self.ray_dir.rglob("*") if p.is_file() and p.suffix in (".log", ".out", ".err")]


@pytest.fixture(scope="session")
def stack_lock() -> Iterator[None]:
    with open(STACK_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def stack(stack_lock: None) -> Iterator[Stack]:
    import ray
    from ray import serve

    from app.builder import build_app

    api_key = "sai-test-" + os.urandom(12).hex()
    ray_dir = Path(tempfile.mkdtemp(prefix="sai-ray-", dir="/tmp"))
    os.environ["SERVICEAI_DEV_API_KEY"] = api_key
    os.environ["HF_HUB_OFFLINE"] = "1"  # no hub on these machines: fail fast, never hang
    port = free_port()
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(ray_dir),
        object_store_memory=512 * 1024 * 1024,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(app_args()), name=APP_NAME, route_prefix="/")
        yield Stack(origin=f"http://127.0.0.1:{port}", api_key=api_key, ray_dir=ray_dir)
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
