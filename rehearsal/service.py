"""ServiceAi on a local rehearsal cluster: the nodes' environment, `serve deploy`, `serve status`.

What cluster.yaml's start commands give every node (SERVICEAI_* settings, Serve's runtime), here
with a SQLite key store in the cluster's folder and Redis only if SERVICEAI_REDIS_URL is set.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from deployments.model_type import tiny_model_dir
from deployments.tiny_model import ensure
from rehearsal.cluster import LocalCluster, worker_node_types
from rehearsal.config import write_rehearsal_config

DEFAULT_ROOT = Path("/tmp/sai-rehearsal")
CONFIG_FILE = "serve_config.rehearsal.yaml"


def node_env(root: Path, http_port: int) -> dict[str, str]:
    """The environment every node's Ray starts with (cluster.yaml: ~/serviceai.env)."""
    return {
        "SERVICEAI_DATABASE_URL": f"sqlite+aiosqlite:///{root / 'keys.db'}",
        "SERVICEAI_REDIS_URL": os.environ.get("SERVICEAI_REDIS_URL", ""),
        "SERVICEAI_ADMIN_TOKEN": secrets.token_urlsafe(32),
        # Production runs several ingress replicas: they must sign console cookies alike.
        "SERVICEAI_SESSION_SECRET": secrets.token_urlsafe(32),
        "SERVICEAI_SESSION_SECRET_PREVIOUS": "",  # set only while the secret is rotated
        # The nodes' HAProxy, on this machine's loopback, is the proxy in front of the ingress.
        "SERVICEAI_TRUSTED_PROXIES": '["127.0.0.0/8"]',
        "SERVICEAI_PUBLIC_BASE_URL": f"http://127.0.0.1:{http_port}/v1",
        "HF_TOKEN": "",
        "HF_HUB_OFFLINE": "1",  # no hub on a rehearsal: fail fast, never hang
        "SERVICEAI_TINY_MODEL_DIR": str(tiny_model_dir()),
    }


def cluster_up(
    root: Path = DEFAULT_ROOT, without: tuple[str, ...] = (), gcs_store: str = ""
) -> LocalCluster:
    """The head and one worker node per node type of cluster.yaml, except those `without`;
    with `gcs_store` (a Redis URL), the head's GCS is kept there (fault tolerance)."""
    node_types = worker_node_types()
    unknown = set(without) - set(node_types)
    if unknown:
        raise ValueError(
            f"unknown node type(s) {sorted(unknown)}; cluster.yaml has {sorted(node_types)}"
        )
    ensure(tiny_model_dir())  # once here, not by several replicas at once
    cluster = LocalCluster.create({}, root, gcs_store)
    cluster.env |= node_env(cluster.root, cluster.http_port)
    try:
        cluster.start_head()
        for name, node_type in node_types.items():
            if name not in without:
                cluster.add_node(node_type)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def add_node(cluster: LocalCluster, node_type: str) -> None:
    if node_type == "head":
        cluster.start_head()
    else:
        cluster.add_node(worker_node_types()[node_type])


def serve_deploy(cluster: LocalCluster, **changes: Any) -> Path:
    """`serve deploy` of the production config with the rehearsal's override (and `changes`)."""
    path = write_rehearsal_config(cluster.root / CONFIG_FILE, cluster.http_port, **changes)
    _serve(cluster, "deploy", str(path))
    return path


def serve_status(cluster: LocalCluster) -> dict[str, Any]:
    """`serve status` as the operator sees it (applications, deployments, proxies)."""
    import yaml

    return yaml.safe_load(_serve(cluster, "status"))


def _serve(cluster: LocalCluster, *args: str) -> str:
    command = [
        str(Path(sys.executable).with_name("serve")),
        *args,
        f"--address={cluster.dashboard_url}",
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, **cluster.env}
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


async def create_api_key(cluster: LocalCluster, email: str = "operator@serviceai.test") -> str:
    """A user on the `pro` plan and a key, through the real key store (as `serviceai users create`)."""
    from app.accounts.keystore import Database, KeyStore

    database = await Database.open(cluster.env["SERVICEAI_DATABASE_URL"])
    try:
        store = KeyStore(database)
        user = await store.create_user(email, plan="pro")
        return (await store.create_key(user.id, "rehearsal")).key
    finally:
        await database.close()


def summary(cluster: LocalCluster) -> dict[str, Any]:
    return {
        "root": str(cluster.root),
        "nodes": {name: node.http_port for name, node in sorted(cluster.nodes.items())},
        "ray_address": cluster.address,
        "dashboard": cluster.dashboard_url,
        "origin": cluster.origin,
        "gcs_store": cluster.env.get("RAY_REDIS_ADDRESS", "none"),
        "database_url": cluster.env["SERVICEAI_DATABASE_URL"],
    }


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def create_key_now(cluster: LocalCluster) -> str:
    return asyncio.run(create_api_key(cluster))
