"""Nothing is dropped when a replica's engine or the replica itself dies (app.serving.migration):
ServiceAi-Fast at two replicas in an application of its own, 16 streams in flight when one
replica's engine is SIGKILLed, then its process; whole replies likewise. Every request
completes as one reply, each with every token it asked for, charged once."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import psutil
import pytest
from ray import serve

from app.builder import build_app
from tests.conftest import Stack, app_args
from tests.e2e.processes import gone, wait_until
from tests.e2e.test_limits import new_user, usage_of

APP = "failover"
FAST = "ServiceAi-Fast"
STREAMS = 16
TOKENS = 256
MIGRATED = re.compile(
    r"Migration \(continue\) of a (\w+) request on ServiceAi-Fast .* (\d+) ms later"
)


@pytest.fixture(scope="module")
def two_fast(stack: Stack) -> str:
    """The base URL of an application whose ServiceAi-Fast runs two replicas."""
    args = app_args()
    fast = dict(args["model_types"][0], num_replicas=2, num_cpus=0.25)
    args = dict(args, model_types=[fast])
    args["plans"] = {name: {FAST: plan[FAST]} for name, plan in args["plans"].items()}
    args["ingress"] = dict(args["ingress"], env_vars={"SERVICEAI_DATABASE_URL": stack.database_url})
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    try:
        yield f"{stack.origin}/{APP}/v1"
    finally:
        serve.delete(APP)


def replicas_of(stack: Stack) -> dict[int, tuple[int, ...]]:
    """Both replicas' pids and their engine cores' pids, once both run with live engines."""
    handle = serve.get_deployment_handle(FAST, APP)

    def both() -> dict[int, tuple[int, ...]] | None:
        if serve.status().applications[APP].deployments[FAST].replica_states != {"RUNNING": 2}:
            return None
        seen: dict[int, tuple[int, ...]] = {}
        for _ in range(20):  # process_ids goes to either replica
            pid, cores, _ = handle.process_ids.remote().result(timeout_s=30)
            seen[pid] = cores
        live = {pid: cores for pid, cores in seen.items() if cores and not any(map(gone, cores))}
        return live if len(live) == 2 else None

    return wait_until(both, timeout_s=240, interval_s=2)


async def stream_all(base: str, key: str, api: str, kill) -> list[dict]:
    """STREAMS streams of TOKENS tokens each; `kill` runs once every stream has its first
    tokens. Each stream's ids, role chunks, text, finish reason, usage and errors."""
    headers = {"Authorization": f"Bearer {key}"}
    started = [asyncio.Event() for _ in range(STREAMS)]
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=300) as http:

        async def one(index: int) -> dict:
            body = {
                "model": FAST,
                "max_tokens": TOKENS,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if api == "chat":
                body["messages"] = [{"role": "user", "content": f"story number {index}"}]
            else:
                body["prompt"] = f"Story number {index}:"
            seen = {"ids": set(), "roles": 0, "text": "", "finish": None, "usage": None}
            path = "/chat/completions" if api == "chat" else "/completions"
            async with http.stream("POST", path, json=body) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        seen["error"] = chunk["error"]
                        continue
                    seen["ids"].add((chunk["id"], chunk["created"]))
                    seen["usage"] = chunk.get("usage") or seen["usage"]
                    for choice in chunk["choices"]:
                        delta = choice.get("delta", {})
                        seen["roles"] += "role" in delta
                        seen["text"] += delta.get("content") or choice.get("text") or ""
                        seen["finish"] = choice["finish_reason"] or seen["finish"]
                        started[index].set()
            return seen

        tasks = [asyncio.create_task(one(i)) for i in range(STREAMS)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=120)
        kill()
        return await asyncio.gather(*tasks)


def log_lines(stack: Stack) -> list[str]:
    return [
        line
        for path in stack.log_files()
        if path.name.startswith("replica_failover_Ingress_")
        for line in path.read_text(errors="replace").splitlines()
        if "Migration (" in line
    ]


@pytest.mark.parametrize("victim", ["engine", "replica"])
def test_sixteen_streams_survive_a_dead_engine_or_replica(stack: Stack, two_fast: str, victim):
    _, key = new_user(stack)
    replicas = replicas_of(stack)
    pid, cores = next(iter(replicas.items()))
    before = len(log_lines(stack))

    def kill() -> None:
        for target in cores if victim == "engine" else (pid,):
            psutil.Process(target).kill()

    api = "chat" if victim == "engine" else "completion"
    streams = asyncio.run(stream_all(two_fast, key, api, kill))
    for seen in streams:
        assert "error" not in seen, seen
        assert len(seen["ids"]) == 1  # one reply, whichever replicas made it
        assert seen["roles"] == (1 if api == "chat" else 0)
        assert seen["finish"] == "length" and seen["text"]
        assert seen["usage"]["completion_tokens"] == TOKENS
    usage = usage_of(two_fast, key, STREAMS)
    assert usage["requests"] == STREAMS
    assert usage["completion_tokens"] == STREAMS * TOKENS
    assert usage["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in streams)
    migrated = [
        MIGRATED.search(line) for line in log_lines(stack)[before:] if MIGRATED.search(line)
    ]
    assert migrated, "no stream was on the replica that died"
    assert {m.group(1) for m in migrated} == {api}
    print(f"{victim} killed: {len(migrated)} of {STREAMS} streams went on, resumed after",
          sorted(int(m.group(2)) for m in migrated), "ms")  # fmt: skip


def test_whole_replies_in_flight_are_redone_on_the_other_replica(stack: Stack, two_fast: str):
    _, key = new_user(stack)
    _, cores = next(iter(replicas_of(stack).items()))
    handle = serve.get_deployment_handle(FAST, APP)
    before = len(log_lines(stack))

    async def replies() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=two_fast, headers=headers, timeout=300) as http:
            body = {"model": FAST, "max_tokens": TOKENS, "ignore_eos": True}
            tasks = [
                asyncio.create_task(
                    http.post(
                        "/chat/completions",
                        json={**body, "messages": [{"role": "user", "content": f"n {i}"}]},
                    )
                )
                for i in range(8)
            ]
            # Both replicas generate (each is asked in turn) before one's engine dies.
            deadline = time.monotonic() + 60
            while (
                sum(await asyncio.gather(*(handle.running_requests.remote() for _ in range(8)))) < 8
            ):
                assert time.monotonic() < deadline, "the replies never started"
            for core in cores:
                psutil.Process(core).kill()
            return await asyncio.gather(*tasks)

    answers = asyncio.run(replies())
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
    assert all(a.json()["usage"]["completion_tokens"] == TOKENS for a in answers)
    usage = usage_of(two_fast, key, 8)
    assert usage["completion_tokens"] == 8 * TOKENS  # the attempts that failed: not charged
    restarted = [line for line in log_lines(stack)[before:] if "Migration (restart)" in line]
    assert restarted, "no reply was on the replica whose engine died"
