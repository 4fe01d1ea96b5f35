"""A Ray cluster of several nodes on one machine, started the way an operator starts one.

Each node is a `ray start` of its own on 127.0.0.1 with its own ports. The nodes are the
node types of cluster.yaml with the same GPU counts and custom resources (accelerator type,
the ingress marker), so Ray's scheduler places replicas as it would on the GPU cluster, while
vLLM itself runs on CPU. CPU counts are logical and small: the machine has few cores.

Every node is started in a session of its own, so that everything it starts (raylet, workers,
vLLM engine processes, HAProxy) can be found and stopped by that session id, without
`ray stop`, which would stop every Ray on the machine.

With a GCS store (a Redis), the head keeps Ray's control plane there, as cluster.yaml's does
(GCS fault tolerance): the head can be lost and started again, and it reads the cluster back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from app.serving.ray_runtime import cluster_env, free_port

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CLUSTER_CONFIG = PROJECT_ROOT / "cluster.yaml"
STATE_FILE = "cluster.json"
# Logical CPUs each worker node advertises; replicas of the rehearsal ask for fractions.
NODE_CPUS = 2
HOST = "127.0.0.1"
START_ATTEMPTS = 3
START_TIMEOUT_S = 120
"""How long one `ray start` may take before the attempt counts as failed."""
WORKER_NICENESS = 10
"""Worker nodes run below the head's CPU priority: in production the head is a machine of its
own (cluster.yaml: CPU 0), so its GCS, dashboard and agents never wait for an engine's CPU;
on one machine they would (see LocalCluster.add_node)."""
REGISTER_WAIT_S = 300
"""How long a node whose `ray start` gave up on Ray's own wait for its raylet is given still
to register (see LocalCluster._registers_late)."""
NODE_LABEL = "serviceai-node"
"""The label that names a rehearsal node (`ray list nodes`: labels)."""
GCS_RECONNECT_S = 600
"""How long a node waits for a lost GCS to come back before it exits (Ray's default: 60 s;
KubeRay sets 600 s where fault tolerance is on), as cluster.yaml's nodes."""


def gcs_store_env(url: str, namespace: str) -> dict[str, str]:
    """Ray's environment for GCS fault tolerance on the Redis at `url` (its password, if
    any, goes to `ray start --head --redis-password`)."""
    store = urlsplit(url)
    return {
        "RAY_REDIS_ADDRESS": f"{store.hostname}:{store.port or 6379}",
        "RAY_external_storage_namespace": namespace,
        "RAY_gcs_rpc_server_reconnect_timeout_s": str(GCS_RECONNECT_S),
    }


@dataclass(frozen=True)
class NodeType:
    """A node type of cluster.yaml, as `ray start` flags."""

    name: str
    num_gpus: int
    resources: dict[str, float]

    @classmethod
    def from_cluster(cls, name: str, config: dict[str, Any]) -> NodeType:
        resources = dict(config["resources"])
        resources.pop("CPU", None)
        return cls(name, int(resources.pop("GPU", 0)), resources)


def worker_node_types(path: Path = CLUSTER_CONFIG) -> dict[str, NodeType]:
    """Every worker node type of cluster.yaml, by name."""
    config = yaml.safe_load(path.read_text())
    return {
        name: NodeType.from_cluster(name, node_type)
        for name, node_type in config["available_node_types"].items()
        if name != config["head_node_type"]
    }


@dataclass
class Node:
    """One running node: the session that holds its processes, and its HTTP proxy port."""

    name: str
    session: int
    http_port: int


@dataclass
class LocalCluster:
    """A head and worker nodes under `root` (short: HAProxy's socket path lives below it).

    The state is kept in root/cluster.json, so that another process (`make cluster-down`)
    can stop what one started.
    """

    root: Path
    gcs_port: int = 0
    dashboard_port: int = 0
    http_port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    gcs_store: str = ""
    """The Redis (redis://[:password@]host:port) that holds the GCS; empty: none."""

    @classmethod
    def create(
        cls, env: dict[str, str], root: Path | None = None, gcs_store: str = ""
    ) -> LocalCluster:
        """A cluster to start; `env` is what every node's Ray is started with (SERVICEAI_*).
        With `gcs_store`, its GCS lives in that Redis under a namespace of its own (the
        folder's name), so clusters sharing the Redis never read each other's."""
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="sai-c-", dir="/tmp"))
        root.mkdir(parents=True, exist_ok=True)
        # Ray's token authentication, as in production (cluster.yaml): one token for every
        # node and client of this cluster, kept in its folder, not in ~/.ray.
        from ray._private.authentication.authentication_token_generator import (
            generate_new_authentication_token,
        )

        token = root / "auth_token"
        token.write_text(generate_new_authentication_token())
        token.chmod(0o600)
        env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        if gcs_store:
            env |= gcs_store_env(gcs_store, namespace=f"rehearsal-{root.name}")
        return cls(
            root=root,
            gcs_port=free_port(),
            dashboard_port=free_port(),
            http_port=free_port(),
            env=env,
            gcs_store=gcs_store,
        )

    @classmethod
    def load(cls, root: Path) -> LocalCluster:
        state = json.loads((root / STATE_FILE).read_text())
        nodes = {name: Node(**node) for name, node in state.pop("nodes").items()}
        return cls(root=root, nodes=nodes, **state)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        """What `serve deploy --address` and `serve status --address` take."""
        return f"http://{HOST}:{self.dashboard_port}"

    @property
    def origin(self) -> str:
        """The head node's HTTP proxy: where clients connect."""
        return f"http://{HOST}:{self.http_port}"

    @property
    def ray_dir(self) -> Path:
        return self.root / "ray"

    def start_head(self) -> None:
        """The control plane only, as in cluster.yaml (CPU 0): GCS, dashboard, Serve controller.

        Again after the head was lost (with a GCS store: it reads the cluster back), on the
        same ports, which the worker nodes know."""
        # A lost head leaves its address in the temp dir, and `ray start --head` refuses to
        # start where that address shows on a running raylet's command line: on one machine,
        # the worker nodes' (ray/scripts/scripts.py, "is already running").
        (self.ray_dir / "ray_current_cluster").unlink(missing_ok=True)
        self._start(
            "head",
            self.http_port,
            [
                "--head",
                f"--port={self.gcs_port}",
                "--num-cpus=0",
                "--include-dashboard=true",
                f"--dashboard-port={self.dashboard_port}",
                f"--dashboard-host={HOST}",
                f"--ray-client-server-port={free_port()}",
                f"--temp-dir={self.ray_dir}",
                *(
                    [f"--redis-password={urlsplit(self.gcs_store).password}"]
                    if urlsplit(self.gcs_store).password
                    else []
                ),
            ],
        )

    def add_node(self, node_type: NodeType, name: str | None = None) -> Node:
        """Start a worker node of this type and join it to the head."""
        name = name or node_type.name
        flags = [
            f"--address={self.address}",
            f"--num-cpus={NODE_CPUS}",
            f"--num-gpus={node_type.num_gpus}",
        ]
        if node_type.resources:
            flags.append(f"--resources={json.dumps(node_type.resources)}")
        # Everything the node starts (raylet, replicas, engines) inherits the niceness. A head
        # started again beside busy engines on a slowed machine (two busy loops on two cores)
        # lost its raylet: its dashboard agent took 15 s to start, longer than the raylet waits
        # for the agent's port file; the same `ray start` failed so in CI runs of 2026-11-30.
        return self._start(name, free_port(), flags, niceness=WORKER_NICENESS)

    def kill_node(self, name: str) -> None:
        """The node is lost: every process of its session gets SIGKILL, nothing shuts down
        (the head too: its GCS, dashboard, Serve controller and HAProxy)."""
        node = self.nodes.pop(name)
        self._save()
        _signal_session(node.session, signal.SIGKILL)
        _wait_session_gone(node.session, timeout_s=30)

    def stop(self) -> None:
        """Stop every node, workers first (SIGTERM, then SIGKILL after a grace period)."""
        for name in sorted(self.nodes, key=lambda n: n == "head"):
            node = self.nodes[name]
            _signal_session(node.session, signal.SIGTERM)
            if not _wait_session_gone(node.session, timeout_s=15, check=False):
                _signal_session(node.session, signal.SIGKILL)
                _wait_session_gone(node.session, timeout_s=15)
            del self.nodes[name]
            self._save()
        if self.gcs_store:
            clear_gcs_store(self.gcs_store, self.env["RAY_external_storage_namespace"])

    def _start(self, name: str, http_port: int, flags: list[str], niceness: int = 0) -> Node:
        """`ray start`, tried again with fresh ports if it fails: on a loaded machine a node can
        lose a port it was given, or miss Ray's 30 s to register with the GCS."""
        if name in self.nodes:
            raise ValueError(f"node {name!r} already runs")
        env = {**os.environ, **self.env, **self._node_env(http_port)}
        log_path = self.root / f"{name}.start.log"
        for attempt in range(1, START_ATTEMPTS + 1):
            command = [
                *(["nice", "-n", str(niceness)] if niceness else []),
                str(Path(sys.executable).with_name("ray")),
                "start",
                f"--node-ip-address={HOST}",
                # Serve takes a node's name for its address (its HAProxy's servers and the
                # head's fallback proxy), so the name stays Ray's default, the node's IP; the
                # rehearsal's node name is a label.
                f"--labels={NODE_LABEL}={name}",
                f"--node-manager-port={free_port()}",
                f"--object-manager-port={free_port()}",
                f"--metrics-export-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}",
                "--object-store-memory=268435456",
                "--disable-usage-stats",
                *flags,
            ]
            with open(log_path, "ab") as log:
                shown = [re.sub("^(--redis-password=).+", r"\1***", a) for a in command]
                log.write(f"--- attempt {attempt}: {' '.join(shown)}\n".encode())
                log.flush()
                # A session of its own: the node's processes share its id (see _signal_session).
                process = subprocess.Popen(
                    command,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            node = Node(name, process.pid, http_port)
            self.nodes[name] = node
            self._save()
            try:
                started = process.wait(timeout=START_TIMEOUT_S) == 0
            except subprocess.TimeoutExpired:
                started = False
            if started or self._registers_late(node, log_path):
                return node
            # Whatever this try left running (a raylet that never registered) goes first.
            del self.nodes[name]
            self._save()
            _signal_session(node.session, signal.SIGKILL)
            _wait_session_gone(node.session, timeout_s=30)
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(
            f"`ray start` of {name} failed {START_ATTEMPTS} times; the end of {log_path}:\n{tail}"
        )

    def _registers_late(self, node: Node, log_path: Path) -> bool:
        """Whether a node whose `ray start` gave up waiting for it registers after all.

        Ray waits a fixed 30 s for the new raylet to register with the GCS (ray/_private/
        node.py, `raylet_start_wait_time_s`), and that wait is the last thing `ray start` does:
        when it runs out, every process it started runs on, and a raylet or GCS that is only
        slow (a loaded machine; checked with the raylet stopped for 45 s) registers later.
        Killing it and starting again would restart the wait, and, for a head, make its GCS
        read the cluster back once more. The wait ends early only when every process of the
        node is gone: a raylet that died beside a running GCS (see add_node) costs the whole
        REGISTER_WAIT_S before the next attempt."""
        if "timed out during startup" not in log_path.read_text(errors="replace")[-4000:]:
            return False
        with open(log_path, "a") as log:
            log.write(f"--- waiting up to {REGISTER_WAIT_S} s for {node.name} to register\n")
        deadline = time.monotonic() + REGISTER_WAIT_S
        while time.monotonic() < deadline and session_processes(node.session):
            if node.name in self._alive_or_none():
                with open(log_path, "a") as log:
                    log.write(f"--- {node.name} registered\n")
                return True
            time.sleep(2)
        return False

    def _alive_or_none(self) -> dict[str, dict[str, Any]]:
        """alive_nodes, or none while the head does not answer (its GCS or dashboard still
        starting)."""
        try:
            return self.alive_nodes()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError):
            return {}

    def ray_list(self, kind: str, *filters: str) -> list[dict[str, Any]]:
        """`ray list KIND --detail` as JSON (actors, nodes, placement-groups), asked of the
        head's dashboard with this cluster's token, as an operator asks."""
        command = [
            str(Path(sys.executable).with_name("ray")),
            "list",
            kind,
            "--detail",
            "--format=json",
            "--limit=10000",
            f"--address={self.dashboard_url}",
            *(f"--filter={f}" for f in filters),
        ]
        try:
            return self._json_of(command)
        except subprocess.TimeoutExpired:
            return self._json_of(command)  # once more

    def _json_of(self, command: list[str]) -> Any:
        """The JSON a CLI command prints. On a loaded machine (a fresh CI run of 2026-11-28,
        during a rolling update) `ray list` printed its whole answer and then did not exit
        within the minute: what it printed counts."""
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, **self.env},
                check=True,
            )
        except subprocess.TimeoutExpired as exc:
            output = exc.output.decode() if isinstance(exc.output, bytes) else exc.output
            try:
                return json.loads(output or "")
            except ValueError:
                raise exc from None
        return json.loads(result.stdout)

    def alive_nodes(self) -> dict[str, dict[str, Any]]:
        """The alive nodes by their rehearsal name (the node's label; Ray's own node name is
        its address, the same for all of them on one machine)."""
        return {n["labels"][NODE_LABEL]: n for n in self.ray_list("nodes", "state=ALIVE")}

    def _node_env(self, http_port: int) -> dict[str, str]:
        """Serve's runtime for this node: its own HAProxy ports (one machine). HAProxy's files
        go under the head's folder (Serve takes it from the controller), one per node id."""
        env = cluster_env(self.root / "h", free_port)
        env["RAY_SERVE_WORKER_PROXY_HTTP_PORT"] = str(http_port)
        env["RAY_SERVE_WORKER_PROXY_GRPC_PORT"] = str(free_port())
        # Replicas import app/ and deployments/ from this checkout, as nodes of the cluster
        # import the installed release.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        return env

    def _save(self) -> None:
        state = asdict(self)
        state.pop("root")
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=2))


def clear_gcs_store(url: str, namespace: str) -> None:
    """Delete a stopped cluster's GCS tables from its Redis (Ray's own clean-up, which
    KubeRay runs when it deletes a cluster with fault tolerance)."""
    from ray._private.gcs_utils import cleanup_redis_storage

    store = urlsplit(url)
    cleanup_redis_storage(
        host=store.hostname or HOST,
        port=store.port or 6379,
        password=store.password or "",
        use_ssl=store.scheme == "rediss",
        storage_namespace=namespace,
        username=store.username or None,
    )


def session_processes(session: int) -> list[int]:
    """The processes of one session, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _signal_session(session: int, sig: signal.Signals) -> None:
    for pid in session_processes(session):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_session_gone(session: int, timeout_s: float, check: bool = True) -> bool:
    deadline = time.monotonic() + timeout_s
    while session_processes(session):
        if time.monotonic() > deadline:
            if check:
                raise TimeoutError(f"processes of session {session} outlived SIGKILL")
            return False
        time.sleep(0.2)
    return True
