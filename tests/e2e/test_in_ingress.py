"""Model types whose engine runs in the ingress's process (`in_ingress`, app.serving.in_process):
every API whole and streamed and charged once, embeddings from a second engine in the same
ingress, a client that leaves frees the engine, and an engine's death ends every open stream and
gets the ingress replaced, its other engine with it.

On the test stack as a second application (`/local`): the local profile's ServiceAi-Fast and
ServiceAi-Embed with `in_ingress: true`, over the stack's key store.
"""

from __future__ import annotations

import asyncio
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
from tests.conftest import Stack, app_args
from tests.e2e.processes import flowing_streams, gone, wait_until
from tests.e2e.test_limits import new_user, usage_of
from tests.e2e.test_serving_processes import every_api

APP = "local"
MODEL = "ServiceAi-Fast"
EMBED = "ServiceAi-Embed"
HI = [{"role": "user", "content": "hi"}]
LONG = {"model": MODEL, "messages": HI, "max_tokens": 1500, "ignore_eos": True, "stream": True}
START_S = 240


def ingress():
    return serve.get_deployment_handle("Ingress", app_name=APP)


def serves(http: httpx.Client) -> bool:
    try:
        response = http.post(
            f"/{APP}/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2}
        )
    except httpx.TransportError:
        return False
    return response.status_code == 200


def processes() -> tuple[int, dict[str, tuple[int, ...]]]:
    """The ingress replica's pid and its engines' core pids by type."""
    return ingress().process_ids.remote().result(timeout_s=30)


@pytest.fixture(scope="module")
def local(stack: Stack, http: httpx.Client) -> str:
    """The application's base URL; deleted, engine and all, after the module."""
    args = app_args()
    chosen = [m for m in args["model_types"] if m["name"] in (MODEL, EMBED)]
    args["model_types"] = [{**m, "in_ingress": True} for m in chosen]
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}", blocking=False)
    try:
        wait_until(lambda: serves(http), timeout_s=START_S, interval_s=1)
        status = serve.status().applications[APP]
        assert set(status.deployments) == {"Ingress"}  # no deployment of its own for a type
        yield f"{stack.origin}/{APP}"
    finally:
        serve.delete(APP)


def test_every_api_whole_and_streamed_is_served_in_the_ingress_and_charged_once(
    stack: Stack, local: str
):
    _, key = new_user(stack, plan="pro")
    replies = asyncio.run(every_api(local, key, MODEL))
    for path, prompt, completion in replies:
        assert prompt > 0, path
        assert 0 < completion <= 12, path
    usage = usage_of(f"{local}/v1", key, expected_requests=len(replies))
    assert usage["requests"] == len(replies)
    assert usage["prompt_tokens"] == sum(r[1] for r in replies)
    assert usage["completion_tokens"] == sum(r[2] for r in replies)
    assert usage["models"] == [MODEL]


def test_embeddings_from_a_second_engine_in_the_same_ingress_are_charged_once(
    stack: Stack, local: str
):
    _, key = new_user(stack, plan="pro")
    response = httpx.post(
        f"{local}/v1/embeddings",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": EMBED, "input": ["one", "two three"]},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert len({len(d["embedding"]) for d in body["data"]}) == 1
    usage = usage_of(f"{local}/v1", key, expected_requests=1)
    assert (usage["requests"], usage["prompt_tokens"]) == (1, body["usage"]["prompt_tokens"])
    assert usage["models"] == [EMBED]


def test_a_client_that_leaves_frees_the_engine(stack: Stack, local: str, http: httpx.Client):
    with http.stream("POST", f"/{APP}/v1/chat/completions", json=LONG) as response:
        lines = response.iter_lines()
        for _ in range(10):
            next(lines)
        assert ingress().running_requests.remote().result(timeout_s=30)[MODEL] == 1
    wait_until(
        lambda: ingress().running_requests.remote().result(timeout_s=30) == {MODEL: 0, EMBED: 0},
        timeout_s=10,
    )


def test_the_engine_killed_mid_stream_ends_every_stream_and_the_ingress_is_replaced(
    stack: Stack, local: str, http: httpx.Client
):
    old, engines = processes()
    cores = engines[MODEL]
    assert cores and engines[EMBED]
    with contextlib.ExitStack() as streams:
        readers = flowing_streams(streams, http, f"/{APP}/v1/chat/completions", LONG)
        killed = time.monotonic()
        for core in cores:
            os.kill(core, signal.SIGKILL)
        for lines in readers:
            rest = [line for line in lines if line.startswith("data: ")]  # ends, no hang
            assert time.monotonic() - killed < 30
            assert rest[-1] == "data: [DONE]", rest[-3:]
            error = json.loads(rest[-2].removeprefix("data: "))
            assert error["error"]["code"] == "model_unavailable", error
    # Until Serve replaces the ingress, a request is refused as for a type with no replica.
    refused = http.post(
        f"/{APP}/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2}
    )
    if refused.status_code != 200:  # the ingress may already be gone
        assert refused.status_code in (502, 503), refused.text
    wait_until(lambda: gone(old), timeout_s=START_S, interval_s=1)
    wait_until(lambda: serves(http), timeout_s=START_S, interval_s=1)
    new, new_engines = processes()
    assert new != old and new_engines[MODEL] and new_engines[EMBED]
    # The old ingress took its other engine with it: nothing of it is left.
    wait_until(lambda: all(gone(c) for c in cores + engines[EMBED]), timeout_s=30)
    assert psutil.pid_exists(new)
