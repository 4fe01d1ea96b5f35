"""How the rehearsal treats a `ray start` that gave up on Ray's own 30 s wait for its node to
register: everything it started runs on, so the node is waited for, not killed. Nothing here
starts Ray: a process in a session of its own stands for the node's processes, and the GCS's
answer is a set of names."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rehearsal.cluster as cluster_module
from rehearsal.cluster import LocalCluster, Node, session_processes

RAY_TIMEOUT = (
    "Exception: The current node timed out during startup. This could happen because some "
    "of the raylet failed to startup or the GCS has become overloaded.\n"
)


@pytest.fixture
def running_node() -> Iterator[Node]:
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield Node("head", process.pid, 0)
    process.kill()
    process.wait()


def cluster_that_registers(tmp_path: Path, after_asks: int) -> tuple[LocalCluster, list[int]]:
    """A cluster whose GCS names the head alive from its `after_asks`-th answer on."""
    cluster = LocalCluster.create({}, root=tmp_path)
    asked = [0]

    def alive() -> dict[str, dict]:
        asked[0] += 1
        return {"head": {"state": "ALIVE"}} if asked[0] >= after_asks else {}

    cluster._alive_or_none = alive  # type: ignore[method-assign]
    return cluster, asked


def test_a_node_that_missed_rays_wait_is_waited_for_until_it_registers(tmp_path, running_node):
    cluster, asked = cluster_that_registers(tmp_path, after_asks=2)
    log = tmp_path / "head.start.log"
    log.write_text(
        "INFO node.py:438 -- Failed to get node info b'RPC error: Deadline Exceeded'\n"
        + RAY_TIMEOUT
    )
    assert cluster._registers_late(running_node, log)
    assert asked == [2]
    assert session_processes(running_node.session)  # nothing was stopped
    assert log.read_text().endswith("--- head registered\n")


def test_a_start_that_failed_otherwise_is_not_waited_for(tmp_path, running_node):
    cluster, asked = cluster_that_registers(tmp_path, after_asks=1)
    log = tmp_path / "head.start.log"
    log.write_text(
        "ConnectionError: Ray is trying to start at 127.0.0.1:6379, but is already running\n"
    )
    assert not cluster._registers_late(running_node, log)
    assert asked == [0]


def test_a_node_whose_processes_end_is_given_up_at_once(tmp_path, running_node):
    cluster, asked = cluster_that_registers(tmp_path, after_asks=10**6)
    log = tmp_path / "head.start.log"
    log.write_text(RAY_TIMEOUT)
    subprocess.run(["kill", "-9", str(running_node.session)], check=True)
    started = time.monotonic()
    assert not cluster._registers_late(running_node, log)
    assert time.monotonic() - started < 10


def test_a_node_that_never_registers_is_given_up_after_the_wait(
    tmp_path, running_node, monkeypatch
):
    monkeypatch.setattr(cluster_module, "REGISTER_WAIT_S", 3)
    cluster, asked = cluster_that_registers(tmp_path, after_asks=10**6)
    log = tmp_path / "head.start.log"
    log.write_text(RAY_TIMEOUT)
    assert not cluster._registers_late(running_node, log)
    assert asked[0] >= 1
    assert session_processes(running_node.session)  # the caller stops it, as for any failed try
