"""What happens around a stream: the client leaving, the engine dying, a type with no replica."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import httpx
import psutil
import pytest
from ray import serve

from app.builder import build_app
from tests.conftest import app_args

LONG = {"messages": [{"role": "user", "content": "Tell me a long story"}], "max_tokens": 1500,
        "stream": True, "extra": "ignored", "ignore_eos": True}


def wait_until(predicate, timeout_s: float, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def test_client_disconnect_aborts_the_engine_request(stack, http):
    engine = stack.handle("ServiceAi-Fast")
    with http.stream("POST", "/v1/chat/completions", json={"model": "ServiceAi-Fast", **LONG}) as response:
        lines = response.iter_lines()
        for _ in range(20):
            next(lines)
        assert engine.running_requests.remote().result() == 1
    # The connection is closed: the engine must let go of the request within a few seconds.
    wait_until(lambda: engine.running_requests.remote().result() == 0, timeout_s=5)


def replica_process(stack, deployment: str) -> psutil.Process:
    """This stack's (single) replica process of `deployment`."""
    title = f"ray::ServeReplica:serviceai:{deployment}"
    replicas = [
        p for p in psutil.process_iter(["cmdline"])
        if " ".join(p.info["cmdline"] or []).startswith(title)
        and str(stack.ray_dir) in " ".join(p.parent().cmdline())
    ]
    assert len(replicas) == 1, replicas
    return replicas[0]


def engine_core_pids(stack, deployment: str) -> list[int]:
    """The engine-core processes under this stack's replica of `deployment`."""
    children = replica_process(stack, deployment).children(recursive=True)
    return [p.pid for p in children if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def serves(http, model: str) -> bool:
    response = http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    return response.status_code == 200


def test_engine_death_mid_stream_ends_the_stream_with_an_error_then_recovers(stack, http, client):
    replica = replica_process(stack, "ServiceAi-Coder")
    pids = engine_core_pids(stack, "ServiceAi-Coder")
    assert pids, "no engine core process found"
    # Step 1: two streams flowing on Coder when its engine process is killed.
    with contextlib.ExitStack() as streams:
        responses = [
            streams.enter_context(
                http.stream("POST", "/v1/chat/completions", json={"model": "ServiceAi-Coder", **LONG})
            )
            for _ in range(2)
        ]
        readers = []
        for response in responses:
            assert response.status_code == 200
            lines = response.iter_lines()
            for _ in range(5):
                next(lines)
            readers.append(lines)
        started = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        # Step 2: each open stream ends with an error event and [DONE], not a hang.
        for lines in readers:
            rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]"
            error = json.loads(rest[-2].removeprefix("data: "))["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "model_unavailable" and "Traceback" not in error["message"]
    assert time.monotonic() - started < 30

    # Step 3: the other model types keep serving while Coder has no engine.
    for model in ("ServiceAi-Fast", "ServiceAi-Pro"):
        assert client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        ).choices

    # Step 4: Serve replaces the replica (a new process), and Step 5: Coder serves again.
    wait_until(lambda: not replica.is_running() or replica.status() == psutil.STATUS_ZOMBIE,
               timeout_s=120, interval_s=1)
    wait_until(lambda: serves(http, "ServiceAi-Coder"), timeout_s=180, interval_s=2)
    assert replica_process(stack, "ServiceAi-Coder").pid != replica.pid


def test_killed_replica_takes_its_engine_processes_with_it(stack, http):
    replica = replica_process(stack, "ServiceAi-Pro")
    engines = [p.pid for p in replica.children(recursive=True)]
    assert engines, "the replica has no engine processes"
    replica.kill()
    # Orphaned engines would hold their memory (a whole GPU in production) until the node dies.
    wait_until(lambda: all(gone(pid) for pid in engines), timeout_s=10)
    wait_until(lambda: serves(http, "ServiceAi-Pro"), timeout_s=180, interval_s=2)


@pytest.fixture
def broken_app(stack):
    """A second application whose only model type cannot start: it never has a healthy replica."""
    args = app_args()
    broken = dict(args["model_types"][0], name="ServiceAi-Broken", model="/nonexistent/model",
                  model_env=None, health_check_period_s=1)
    args["model_types"] = [broken]
    args["plans"] = {plan: {"ServiceAi-Broken": limits["ServiceAi-Fast"]}
                     for plan, limits in args["plans"].items()}
    serve._run(build_app(args), name="broken", route_prefix="/broken", _blocking=False)
    yield f"{stack.origin}/broken"
    serve.delete("broken", _blocking=True)


def test_type_without_a_healthy_replica_gets_503(stack, broken_app):
    def answer() -> httpx.Response | None:
        try:
            response = httpx.post(
                f"{broken_app}/v1/chat/completions",
                json={"model": "ServiceAi-Broken", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {stack.api_key}"},
                timeout=10,
            )
        except httpx.TimeoutException:
            return None
        return response if response.status_code == 503 and "error" in response.json() else None

    started = time.monotonic()
    response = wait_until(answer, timeout_s=120, interval_s=1)
    # Refused at once, not after queueing for a replica that never comes.
    assert time.monotonic() - started < 30
    error = response.json()["error"]
    assert error["code"] == "model_unavailable" and "ServiceAi-Broken" in error["message"]
    assert int(response.headers["retry-after"]) > 0
