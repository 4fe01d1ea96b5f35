"""Nothing is dropped when a replica's engine or the replica itself dies (app.serving.migration):
ServiceAi-Fast at two replicas in an application of its own, 16 streams in flight when one
replica's engine is SIGKILLed (chat and Messages streams), then its process (completions and
Responses streams); whole replies likewise. Every request completes as one reply, each with
every token it asked for, charged once."""

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


async def busiest(replicas: dict[int, tuple[int, ...]]) -> tuple[int, tuple[int, ...]]:
    """The replica (pid, engine cores) that holds the most requests now.

    The ingress's router may not know of a replica that has just replaced another (it hears of
    it by long-poll) and send it nothing, while that replica's engine may still be busy
    starting: the replica to kill is one seen holding requests, not one seen busy."""
    handle = serve.get_deployment_handle(FAST, APP)
    held: dict[int, int] = {}
    seen: tuple[str, ...] = ()
    for _ in range(4 * len(replicas)):  # each call passes over the replicas read already
        replica, pid, _, running = await handle.served.remote(avoid=seen)
        seen, held[pid] = (*seen, replica), running
        if held.keys() >= replicas.keys():
            break
    pid = max(replicas, key=lambda p: held.get(p, 0))
    return pid, replicas[pid]


PATHS = {
    "chat": "/chat/completions",
    "completion": "/completions",
    "messages": "/messages",
    "responses": "/responses",
}


def request(api: str, index: int) -> dict:
    """A stream of TOKENS tokens on `api` (Messages takes no ignore_eos: the random model may
    end sooner)."""
    body = {"model": FAST, "max_tokens": TOKENS, "stream": True}
    words = f"story number {index}"
    if api == "chat":
        return {**body, "messages": [{"role": "user", "content": words}], "ignore_eos": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
    if api == "completion":
        return {**body, "prompt": f"Story number {index}:", "ignore_eos": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
    if api == "messages":
        return {**body, "messages": [{"role": "user", "content": words}]}
    del body["max_tokens"]
    return {**body, "input": words, "max_output_tokens": TOKENS, "ignore_eos": True}


def read(api: str, event: dict, seen: dict) -> None:
    """What one event of `api` tells: its reply's identity, text, end and usage."""
    if api in ("chat", "completion"):
        seen["ids"].add((event["id"], event["created"]))
        if event.get("usage"):
            seen["prompt"] = event["usage"]["prompt_tokens"]
            seen["completion"] = event["usage"]["completion_tokens"]
        for choice in event["choices"]:
            delta = choice.get("delta", {})
            seen["opened"] += "role" in delta
            seen["text"] += delta.get("content") or choice.get("text") or ""
            seen["finish"] = choice["finish_reason"] or seen["finish"]
    elif api == "messages":
        kind = event["type"]
        if kind == "message_start":
            seen["opened"] += 1
            seen["ids"].add(event["message"]["id"])
            seen["prompt"] = event["message"]["usage"]["input_tokens"]
        elif kind == "content_block_start":
            seen["blocks"] += 1
        elif kind == "content_block_delta":
            seen["text"] += event["delta"]["text"]
        elif kind == "message_delta":
            seen["finish"] = event["delta"]["stop_reason"]
            seen["completion"] = event["usage"]["output_tokens"]
    else:
        seen["sequence"].append(event["sequence_number"])
        if event["type"] == "response.created":
            seen["opened"] += 1
        if "response" in event:
            seen["ids"].add(event["response"]["id"])
        seen["items"].add(event.get("item_id") or event.get("item", {}).get("id"))
        if event["type"] == "response.output_text.delta":
            seen["text"] += event["delta"]
        if event["type"] == "response.output_text.done":
            seen["done_text"] = event["text"]
        if event["type"] in ("response.completed", "response.incomplete"):
            response = event["response"]
            seen["finish"] = response["status"]
            seen["done_text"] = response["output"][0]["content"][0]["text"]
            seen["prompt"] = response["usage"]["input_tokens"]
            seen["completion"] = response["usage"]["output_tokens"]


async def stream_all(base: str, key: str, apis: tuple[str, str], kill) -> list[dict]:
    """STREAMS streams of TOKENS tokens each, on the two `apis` in turn; `kill` runs once
    every stream has its first tokens. What each stream's events said, and its errors."""
    headers = {"Authorization": f"Bearer {key}"}
    started = [asyncio.Event() for _ in range(STREAMS)]
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=300) as http:

        async def one(index: int) -> dict:
            api = apis[index % 2]
            seen = {"api": api, "ids": set(), "opened": 0, "blocks": 0, "text": "",
                    "finish": None, "prompt": None, "completion": None, "sequence": [],
                    "items": set()}  # fmt: skip
            async with http.stream("POST", PATHS[api], json=request(api, index)) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        seen["error"] = event["error"]
                        continue
                    read(api, event, seen)
                    if seen["text"]:
                        started[index].set()
            started[index].set()  # a Messages reply may end before its first text
            return seen

        tasks = [asyncio.create_task(one(i)) for i in range(STREAMS)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=120)
        await kill()
        return await asyncio.gather(*tasks)


def one_reply(seen: dict) -> None:
    """A stream the client read as one reply, whichever replicas made it."""
    api = seen["api"]
    assert "error" not in seen, seen
    assert len(seen["ids"]) == 1 and seen["opened"] == (api != "completion"), seen
    if api == "messages":
        assert seen["blocks"] <= 1 and seen["finish"] in ("max_tokens", "end_turn"), seen
        assert 0 < seen["completion"] <= TOKENS, seen
        return
    assert seen["completion"] == TOKENS and seen["text"], seen
    if api == "responses":
        assert seen["finish"] == "incomplete" and seen["done_text"] == seen["text"], seen
        assert seen["sequence"] == list(range(len(seen["sequence"]))), seen
        assert len(seen["items"] - {None}) == 1, seen
    else:
        assert seen["finish"] == "length", seen


def log_lines(stack: Stack) -> list[str]:
    return [
        line
        for path in stack.log_files()
        if path.name.startswith("replica_failover_Ingress_")
        for line in path.read_text(errors="replace").splitlines()
        if "Migration (" in line
    ]


@pytest.mark.parametrize(
    "victim, apis", [("engine", ("chat", "messages")), ("replica", ("completion", "responses"))]
)
def test_sixteen_streams_survive_a_dead_engine_or_replica(
    stack: Stack, two_fast: str, victim, apis
):
    _, key = new_user(stack)
    replicas = replicas_of(stack)
    before = len(log_lines(stack))

    async def kill() -> None:
        pid, cores = await busiest(replicas)
        for target in cores if victim == "engine" else (pid,):
            psutil.Process(target).kill()

    streams = asyncio.run(stream_all(two_fast, key, apis, kill))
    for seen in streams:
        one_reply(seen)
    usage = usage_of(two_fast, key, STREAMS)
    assert usage["requests"] == STREAMS
    assert usage["completion_tokens"] == sum(s["completion"] for s in streams)
    assert usage["prompt_tokens"] == sum(s["prompt"] for s in streams)
    migrated = [
        MIGRATED.search(line) for line in log_lines(stack)[before:] if MIGRATED.search(line)
    ]
    assert migrated, "no stream was on the replica that died"
    assert {m.group(1) for m in migrated} <= set(apis)
    print(f"{victim} killed: {len(migrated)} of {STREAMS} streams went on "
          f"({', '.join(f'{a} {sum(m.group(1) == a for m in migrated)}' for a in apis)}), "
          "resumed after", sorted(int(m.group(2)) for m in migrated), "ms")  # fmt: skip


def test_whole_replies_in_flight_are_redone_on_the_other_replica(stack: Stack, two_fast: str):
    _, key = new_user(stack)
    replicas = replicas_of(stack)
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
            for core in (await busiest(replicas))[1]:
                psutil.Process(core).kill()
            return await asyncio.gather(*tasks)

    answers = asyncio.run(replies())
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
    assert all(a.json()["usage"]["completion_tokens"] == TOKENS for a in answers)
    usage = usage_of(two_fast, key, 8)
    assert usage["completion_tokens"] == 8 * TOKENS  # the attempts that failed: not charged
    restarted = [line for line in log_lines(stack)[before:] if "Migration (restart)" in line]
    assert restarted, "no reply was on the replica whose engine died"
