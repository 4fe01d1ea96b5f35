"""A model replica whose vLLM engine died fails Serve's health check and is replaced."""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil

from tests.conftest import Stack, error_of

MODEL_TYPE = "ServiceAi-Pro"
REPLACED_WITHIN_S = 240  # 3 failed checks 10 s apart, then a replica start (~25 s here)


def replica_process(stack: Stack) -> psutil.Process:
    """The Ray worker of this session that runs the model type's replica."""
    title = f"ServeReplica:serviceai:{MODEL_TYPE}"
    for process in psutil.process_iter(["cmdline"]):
        try:
            if title in " ".join(process.info["cmdline"] or ()) and (
                process.environ().get("SERVICEAI_DATABASE_URL") == stack.database_url
            ):
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no process runs {title}")


def engine_core(replica: psutil.Process) -> psutil.Process:
    children = replica.children(recursive=True)
    # vLLM titles the process "VLLM::EngineCore" (its short name is cut at 15 characters).
    cores = [p for p in children if "EngineCore" in " ".join(p.cmdline())]
    assert len(cores) == 1, [p.cmdline() for p in children]
    return cores[0]


def test_a_replica_whose_engine_died_is_replaced(stack: Stack, http: httpx.Client):
    chat = {"model": MODEL_TYPE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    old = replica_process(stack)
    os.kill(engine_core(old).pid, signal.SIGKILL)

    refusals = set()
    deadline = time.monotonic() + REPLACED_WITHIN_S
    while True:
        response = http.post("/v1/chat/completions", json=chat)
        if response.status_code == 200:
            break
        refusals.add(error_of(response, 503)["code"])
        assert time.monotonic() < deadline, f"{MODEL_TYPE} still refuses: {refusals}"
        time.sleep(2)
    # Between the death and the new replica, clients were told to retry, never sent a 500.
    assert refusals and refusals <= {"model_unavailable", "model_overloaded"}
    new = replica_process(stack)
    assert new.pid != old.pid and engine_core(new).is_running()
    assert http.get("/ready").json()["model_types"][MODEL_TYPE] == "ready"
