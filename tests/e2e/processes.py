"""The processes behind a model type, as its own replica reports them, and bounded waits.

Tests never find a replica's engine by its process title: vLLM sets "VLLM::EngineCore" only
after the spawned child has imported vLLM, seconds after the process exists.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import httpx
import psutil

from tests.conftest import Stack

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.2) -> T:
    """The first truthy value of `predicate`, polled until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def whole_gang(model_type: str, size: int) -> bool:
    """Every replica of the type's deployment runs (a gang's members start one by one)."""
    from ray import serve

    from tests.conftest import APP_NAME

    deployment = serve.status().applications[APP_NAME].deployments[model_type]
    return deployment.replica_states == {"RUNNING": size}


def replicas_of_engine(stack: Stack, model_type: str) -> dict[int, tuple[int, int]]:
    """Each replica that is a client of the type's engine (one; a gang's members with
    `serving_processes`, deployments/serving_processes.py): pid -> (requests it took, requests
    it still holds). The router passes over those read already (`avoid`), busy or not."""
    handle = stack.handle(model_type)
    _, _, others = handle.process_ids.remote().result(timeout_s=30)
    seen: dict[str, tuple[int, int, int]] = {}
    for _ in range(10 * (len(others) + 1)):  # a member being replaced may answer twice
        replica, pid, served, running = handle.served.remote(avoid=tuple(seen)).result(timeout_s=30)
        seen[replica] = (pid, served, running)
        if len(seen) == len(others) + 1:
            return {pid: (served, running) for pid, served, running in seen.values()}
    raise AssertionError(f"{model_type}: {len(others) + 1} replicas expected, found {seen}")


def engine_requests(stack: Stack, model_type: str) -> int:
    """The requests the type's engine holds, over every replica that is its client."""
    return sum(running for _, running in replicas_of_engine(stack, model_type).values())


def flowing_streams(
    streams: contextlib.ExitStack, http: httpx.Client, path: str, body: dict, count: int = 2
) -> list[Iterator[str]]:
    """`count` streams of `body` on `path`, each open in `streams` and five lines in: their
    line readers."""
    responses = [streams.enter_context(http.stream("POST", path, json=body)) for _ in range(count)]
    readers = []
    for response in responses:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(5):
            next(lines)
        readers.append(lines)
    return readers


def serves(http: httpx.Client, model: str) -> bool:
    response = http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    return response.status_code == 200


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass(frozen=True)
class ReplicaProcesses:
    replica: psutil.Process
    engine_cores: list[psutil.Process]


def serving_replica(
    stack: Stack, http: httpx.Client, model_type: str, timeout_s: float = 180
) -> ReplicaProcesses:
    """The (single) replica of `model_type` once it answers a request and reports live engine
    cores; waits through a replica that is still starting or being replaced. With several
    serving processes, the replica of the gang that launched the engine (rank 0)."""

    def ready() -> ReplicaProcesses | None:
        if not serves(http, model_type):
            return None
        try:
            replica_pid, core_pids, others = (
                stack.handle(model_type).process_ids.remote().result(timeout_s=30)
            )
            if others and core_pids:
                if not whole_gang(model_type, len(others) + 1):
                    return None
                launcher = psutil.Process(core_pids[0]).ppid()
                replica_pid = launcher if launcher in others else replica_pid
            processes = ReplicaProcesses(
                psutil.Process(replica_pid), [psutil.Process(pid) for pid in core_pids]
            )
        except (psutil.NoSuchProcess, TimeoutError, RuntimeError):
            return None
        alive = processes.engine_cores and not any(gone(p.pid) for p in processes.engine_cores)
        return processes if alive else None

    return wait_until(ready, timeout_s, interval_s=1)
