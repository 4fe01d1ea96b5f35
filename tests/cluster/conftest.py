"""A rehearsal cluster for the module: `ray start` nodes, `serve deploy` of the production config.

Everything here talks to the cluster from outside, as an operator and a client would: the
`serve` and `ray` commands, and HTTP to the head node's proxy.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from rehearsal.cluster import LocalCluster
from rehearsal.service import cluster_up, create_api_key, serve_deploy, serve_status
from tests.conftest import REDIS

LATE_NODE = "gpu_h100"
"""Left out at start: ServiceAi-Pro is deployed before any node can host it."""

T = TypeVar("T")


def pytest_collection_modifyitems(items):
    for item in items:
        if "/cluster/" in str(item.path):
            item.add_marker(pytest.mark.cluster)


def wait_for(
    probe: Callable[[], T], timeout_s: float, interval_s: float = 0.5, what: str = ""
) -> T:
    """Poll until `probe` returns something truthy; fail with the last value after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, (
            f"timed out after {timeout_s} s waiting for {what}: {value!r}"
        )
        time.sleep(interval_s)


@dataclass
class Rehearsal:
    cluster: LocalCluster
    api_key: str
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def origin(self) -> str:
        return self.cluster.origin

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def status(self) -> dict[str, Any]:
        return serve_status(self.cluster)

    def app_status(self, app: str) -> str:
        return self.status()["applications"].get(app, {}).get("status", "")

    def ray_list(self, kind: str, *filters: str) -> list[dict[str, Any]]:
        return self.cluster.ray_list(kind, *filters)

    def placement_group(self, group_id: str) -> dict[str, Any]:
        """Ray's own record of a placement group (strategy, bundles, bundle -> node)."""
        code = (
            "import json, ray; from ray.util.placement_group import PlacementGroup, placement_group_table;"
            f"from ray._raylet import PlacementGroupID; ray.init(address={self.cluster.address!r}, log_to_driver=False);"
            f"print(json.dumps(placement_group_table(PlacementGroup(PlacementGroupID.from_hex({group_id!r})))))"
        )
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **self.cluster.env},
            check=True,
        )
        return json.loads(result.stdout.strip().splitlines()[-1])

    def alive_nodes(self) -> dict[str, dict[str, Any]]:
        return self.cluster.alive_nodes()

    def node_origin(self, node: str) -> str:
        """That node's proxy (HAProxy): where a client connects if the balancer sends it there."""
        return f"http://127.0.0.1:{self.cluster.nodes[node].http_port}"

    def alive_replicas(self, deployment: str) -> list[dict[str, Any]]:
        return [
            a
            for a in self.ray_list("actors", "state=ALIVE")
            if a["class_name"].startswith("ServeReplica:")
            and a["class_name"].endswith(f":{deployment}")
        ]

    def ready(self) -> tuple[int, dict[str, Any]]:
        response = httpx.get(f"{self.origin}/ready", timeout=10)
        return response.status_code, response.json()

    def chat(self, model: str, **body: Any) -> httpx.Response:
        return httpx.post(
            f"{self.origin}/v1/chat/completions",
            headers=self.headers,
            timeout=120,
            json={
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
                **body,
            },
        )

    def serves(self, model: str) -> bool:
        try:
            return self.chat(model).status_code == 200
        except httpx.TransportError:
            return False

    def deploy(self, **changes: Any) -> None:
        serve_deploy(self.cluster, **changes)


@pytest.fixture(scope="module")
def rehearsal(request: pytest.FixtureRequest, stack_lock: None) -> Iterator[Rehearsal]:
    root = Path(tempfile.mkdtemp(prefix="sai-c-", dir="/tmp"))
    failed_before = request.session.testsfailed
    cluster = None
    try:
        started = time.monotonic()
        # GCS fault tolerance on the test Redis, as production keeps it in a Redis of its own.
        cluster = cluster_up(root, without=(LATE_NODE,), gcs_store=REDIS)
        up_s = time.monotonic() - started
        api_key = asyncio.run(create_api_key(cluster))
        serve_deploy(cluster)
        rehearsal = Rehearsal(cluster, api_key)
        wait_for(
            lambda: rehearsal.serves("ServiceAi-Fast"),
            timeout_s=300,
            interval_s=2,
            what="ServiceAi-Fast to serve after serve deploy",
        )
        rehearsal.figures["cluster_up_4_nodes_s"] = round(up_s, 1)
        rehearsal.figures["serve_deploy_to_first_answer_s"] = round(
            time.monotonic() - started - up_s, 1
        )
        yield rehearsal
        print("\nrehearsal figures:", json.dumps(rehearsal.figures, indent=2))
    finally:
        if cluster is not None:
            cluster.stop()
        if request.session.testsfailed > failed_before:
            # The nodes' Ray and Serve logs, for whoever reads the failure.
            kept = Path(tempfile.mkdtemp(prefix="sai-cluster-logs-", dir="/tmp"))
            shutil.copytree((root / "ray" / "session_latest" / "logs").resolve(), kept / "logs")
            print(f"\nrehearsal cluster logs kept in {kept}")
        shutil.rmtree(root, ignore_errors=True)
