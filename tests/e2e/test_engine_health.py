"""A model replica whose vLLM engine died fails Serve's health check and is replaced."""

from __future__ import annotations

import time

import httpx

from tests.conftest import Stack, error_of
from tests.e2e.processes import serving_replica

MODEL_TYPE = "ServiceAi-Pro"
REPLACED_WITHIN_S = 240  # 3 failed checks 10 s apart, then a replica start (~25 s here)


def test_a_replica_whose_engine_died_is_replaced(stack: Stack, http: httpx.Client):
    chat = {"model": MODEL_TYPE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    old = serving_replica(stack, http, MODEL_TYPE)
    for core in old.engine_cores:
        core.kill()

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
    new = serving_replica(stack, http, MODEL_TYPE)
    assert new.replica.pid != old.replica.pid
    assert http.get("/ready").json()["model_types"][MODEL_TYPE] == "ready"
