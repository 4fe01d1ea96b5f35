"""What happens around a stream: the client leaving, the engine dying, a type with no replica."""

from __future__ import annotations

import contextlib
import json
import time

import httpx
import psutil
import pytest
from ray import serve

from app.builder import build_app
from tests.conftest import app_args
from tests.e2e.processes import flowing_streams, gone, serves, serving_replica, wait_until

LONG = {
    "messages": [{"role": "user", "content": "Tell me a long story"}],
    "max_tokens": 1500,
    "stream": True,
    "ignore_eos": True,
}


def test_client_disconnect_aborts_the_engine_request(stack, http):
    engine = stack.handle("ServiceAi-Fast")
    with http.stream(
        "POST", "/v1/chat/completions", json={"model": "ServiceAi-Fast", **LONG}
    ) as response:
        lines = response.iter_lines()
        for _ in range(20):
            next(lines)
        assert engine.running_requests.remote().result() == 1
    # The connection is closed: the engine must let go of the request within a few seconds.
    wait_until(lambda: engine.running_requests.remote().result() == 0, timeout_s=5)


def test_engine_death_mid_stream_ends_the_stream_with_an_error_then_recovers(stack, http, client):
    processes = serving_replica(stack, http, "ServiceAi-Coder")
    replica = processes.replica
    # Step 1: two streams flowing on Coder when its engine process is killed.
    with contextlib.ExitStack() as streams:
        readers = flowing_streams(
            streams, http, "/v1/chat/completions", {"model": "ServiceAi-Coder", **LONG}
        )
        started = time.monotonic()
        for core in processes.engine_cores:
            core.kill()
        # Step 2: each open stream ends with an error event and [DONE], not a hang.
        for lines in readers:
            rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]", rest[-3:]
            error = json.loads(rest[-2].removeprefix("data: ")).get("error")
            assert error is not None, (time.monotonic() - started, len(rest), rest[-3:])
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "model_unavailable" and "Traceback" not in error["message"]
    assert time.monotonic() - started < 30

    # Step 3: the other model types keep serving while Coder has no engine.
    for model in ("ServiceAi-Fast", "ServiceAi-Pro"):
        assert client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        ).choices

    # Step 4: Serve replaces the replica (a new process), and Step 5: Coder serves again.
    wait_until(
        lambda: not replica.is_running() or replica.status() == psutil.STATUS_ZOMBIE,
        timeout_s=120,
        interval_s=1,
    )
    assert serving_replica(stack, http, "ServiceAi-Coder").replica.pid != replica.pid


def test_killed_replica_takes_its_engine_processes_with_it(stack, http):
    processes = serving_replica(stack, http, "ServiceAi-Pro")
    engines = [p.pid for p in processes.replica.children(recursive=True)]
    assert {p.pid for p in processes.engine_cores} <= set(engines)
    processes.replica.kill()
    # Orphaned engines would hold their memory (a whole GPU in production) until the node dies.
    wait_until(lambda: all(gone(pid) for pid in engines), timeout_s=10)
    wait_until(lambda: serves(http, "ServiceAi-Pro"), timeout_s=180, interval_s=2)


@pytest.fixture
def broken_app(stack):
    """A second application whose only model type cannot start: it never has a healthy replica."""
    args = app_args()
    broken = dict(
        args["model_types"][0],
        name="ServiceAi-Broken",
        model="/nonexistent/model",
        model_env=None,
        health_check_period_s=1,
    )
    args["model_types"] = [broken]
    args["plans"] = {
        plan: {"ServiceAi-Broken": limits["ServiceAi-Fast"]}
        for plan, limits in args["plans"].items()
    }
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
