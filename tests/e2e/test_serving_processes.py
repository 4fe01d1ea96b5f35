"""Several serving processes over one engine (deployments/serving_processes.py), on the stack's
ServiceAi-Pro, which runs two: a gang of two replicas (tests/conftest.py, `stack_app_args`).
Every API through both, usage and metrics counted once, a conversation's turns on either,
aborts that reach the engine from either, and a serving process killed mid-stream. The
engine's death under them is tests/e2e/test_engine_survival.py's and test_engine_health.py's
(they kill Pro's core)."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import anthropic
import httpx
import psutil

from tests.conftest import PROCESSES_TYPE, Stack
from tests.e2e.processes import gone, replicas_of_engine, serving_replica, wait_until
from tests.e2e.test_limits import new_user, usage_of
from tests.e2e.test_observability import COMPLETION, PROMPT, REQUESTS, settled

MODEL = PROCESSES_TYPE
HI = [{"role": "user", "content": "hi"}]


def handle(stack: Stack):
    return stack.handle(MODEL)


def members(stack: Stack) -> dict[int, tuple[int, int]]:
    return replicas_of_engine(stack, MODEL)


def process_ids(stack: Stack) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    return handle(stack).process_ids.remote().result(timeout_s=30)


async def every_api(base: str, key: str, model: str = MODEL) -> list[tuple[str, int, int]]:
    """One request of each API, whole and streamed, all at once: (what, prompt, completion)."""
    auth = {"Authorization": f"Bearer {key}"}
    ask = {"model": model, "max_tokens": 12, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=base, headers=auth, timeout=120) as client:

        async def whole(path: str, body: dict) -> tuple[str, int, int]:
            response = await client.post(path, json=body)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            if path == "/v1/messages":
                return path, usage["input_tokens"], usage["output_tokens"]
            if path == "/v1/responses":
                return path, usage["input_tokens"], usage["output_tokens"]
            return path, usage["prompt_tokens"], usage["completion_tokens"]

        async def streamed(path: str, body: dict) -> tuple[str, int, int]:
            events = []
            async with client.stream("POST", path, json={**body, "stream": True}) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        events.append(json.loads(line.removeprefix("data: ")))
            assert not any("error" in e for e in events), events[-1]
            if path == "/v1/messages":
                start = next(e for e in events if e["type"] == "message_start")
                end = next(e for e in events if e["type"] == "message_delta")
                return (
                    path,
                    start["message"]["usage"]["input_tokens"],
                    end["usage"]["output_tokens"],
                )
            if path == "/v1/responses":
                done = next(e for e in events if e["type"] == "response.completed")
                usage = done["response"]["usage"]
                return path, usage["input_tokens"], usage["output_tokens"]
            usage = events[-1]["usage"]
            return path, usage["prompt_tokens"], usage["completion_tokens"]

        chat = {**ask, "messages": HI, "stream_options": {"include_usage": True}}
        completion = {**ask, "prompt": "hi", "stream_options": {"include_usage": True}}
        responses = {"model": model, "input": "hi", "max_output_tokens": 12}
        messages = {"model": model, "max_tokens": 12, "messages": HI}
        calls = []
        for _ in range(2):
            calls += [
                whole("/v1/chat/completions", {k: v for k, v in chat.items() if "stream" not in k}),
                streamed("/v1/chat/completions", chat),
                whole(
                    "/v1/completions", {k: v for k, v in completion.items() if "stream" not in k}
                ),
                streamed("/v1/completions", completion),
                whole("/v1/responses", responses),
                streamed("/v1/responses", responses),
                whole("/v1/messages", messages),
                streamed("/v1/messages", messages),
            ]
        return list(await asyncio.gather(*calls))


def test_every_api_is_served_whole_and_streamed_by_both_processes_and_charged_once(
    stack: Stack, http: httpx.Client
):
    serving_replica(stack, http, MODEL)
    _, key = new_user(stack, plan="pro")
    before, counted_before = members(stack), settled(stack)
    replies = asyncio.run(every_api(stack.origin, key))
    after = members(stack)
    # Sixteen at once: the router spreads them over the gang's members, so both serve.
    assert after.keys() == before.keys()
    assert all(after[pid][0] > before[pid][0] for pid in before), (before, after)
    for path, prompt, completion in replies:
        assert prompt > 0, path
        assert 0 < completion <= 12, path
    usage = usage_of(stack.base_url, key, expected_requests=len(replies))
    assert usage["requests"] == len(replies)
    # What the engine counted, once: the clients' usage, summed, is what the key is charged.
    assert usage["prompt_tokens"] == sum(r[1] for r in replies)
    assert usage["completion_tokens"] == sum(r[2] for r in replies)
    # And the service's metrics, once per request, by the ingress.
    grown = settled(stack) - counted_before
    assert {
        name: sum(
            v for (n, labels), v in grown.items() if n == name and ("model_type", MODEL) in labels
        )
        for name in (REQUESTS, PROMPT, COMPLETION)
    } == {
        REQUESTS: len(replies),
        PROMPT: sum(r[1] for r in replies),
        COMPLETION: sum(r[2] for r in replies),
    }


def test_a_conversations_turns_go_to_either_process_of_its_engine(stack: Stack, http: httpx.Client):
    """The members share their engine's prefix cache, and the router counts engines: a
    conversation's later turns go to whichever member is less busy (ties either way), each
    finding the turns before it cached. (A router that counted members would send them all to
    the member that took the first turn.)"""
    serving_replica(stack, http, MODEL)
    system = {"role": "system", "content": " ".join(f"gang{n}" for n in range(200))}
    first = [system, {"role": "user", "content": "first turn"}]

    def turn(messages: list[dict]) -> dict:
        response = http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2}
        )
        assert response.status_code == 200, response.text
        return response.json()

    reply = turn(first)["choices"][0]["message"]["content"]
    later = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
    before = members(stack)

    def both_served() -> bool:
        assert turn(later)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        after = members(stack)
        return all(after[pid][0] > before[pid][0] for pid in before)

    # Serve's choice within the rank reads its own count of each member's requests, which
    # may lag for a member it has not sent to for a while: a few turns, not one.
    wait_until(both_served, timeout_s=60, interval_s=0)


def test_a_client_that_leaves_frees_the_engine_from_either_process(
    stack: Stack, http: httpx.Client
):
    serving_replica(stack, http, MODEL)
    long = {"model": MODEL, "messages": HI, "max_tokens": 1500, "ignore_eos": True}

    async def leave_mid_stream() -> None:
        async with httpx.AsyncClient(
            base_url=stack.origin,
            headers={"Authorization": f"Bearer {stack.api_key}"},
            timeout=120,
        ) as client:

            async def one() -> None:
                async with client.stream(
                    "POST", "/v1/chat/completions", json={**long, "stream": True}
                ) as stream:
                    lines = stream.aiter_lines()
                    for _ in range(3):
                        await anext(lines)

            await asyncio.gather(*(one() for _ in range(8)))  # left after three lines each

    before = members(stack)
    asyncio.run(leave_mid_stream())
    after = members(stack)
    assert sum(a[0] for a in after.values()) >= sum(b[0] for b in before.values()) + 8
    wait_until(lambda: all(m[1] == 0 for m in members(stack).values()), 30)


def test_a_serving_process_killed_mid_stream_ends_its_streams_and_the_gang_is_replaced(
    stack: Stack, http: httpx.Client
):
    serving_replica(stack, http, MODEL)
    gang = set(members(stack))
    _, cores, _ = process_ids(stack)
    launcher = psutil.Process(cores[0]).ppid()  # rank 0 launched the core
    assert launcher in gang, (launcher, gang)
    [victim] = gang - {launcher}  # the member that is only a client of the core
    long = {"model": MODEL, "messages": HI, "max_tokens": 1500, "ignore_eos": True}

    async def streams_while_killed() -> list[list[str]]:
        async with httpx.AsyncClient(
            base_url=stack.origin,
            headers={"Authorization": f"Bearer {stack.api_key}"},
            timeout=120,
        ) as client:

            async def one(started: asyncio.Event) -> list[str]:
                async with client.stream(
                    "POST", "/v1/chat/completions", json={**long, "stream": True}
                ) as stream:
                    lines = [line async for line in _until_started(stream, started)]
                    return lines

            events = [asyncio.Event() for _ in range(4)]
            tasks = [asyncio.ensure_future(one(e)) for e in events]
            await asyncio.gather(*(e.wait() for e in events))
            os.kill(victim, signal.SIGKILL)
            return list(await asyncio.wait_for(asyncio.gather(*tasks), 120))

    streams = asyncio.run(streams_while_killed())
    # Serve restarts the whole gang: the killed member's streams end with the engine's failure
    # and [DONE], and so do the others' when their member is stopped with it (unless failover
    # found them a replica); none hangs.
    failed = [s for s in streams if "model_unavailable" in "".join(s[-3:])]
    assert failed, [s[-2:] for s in streams]
    for lines in failed:
        assert json.loads(lines[-2].removeprefix("data: "))["error"]["code"] == "model_unavailable"
    for lines in streams:
        assert lines[-1] == "data: [DONE]"
    # The other types serve meanwhile; Serve replaces both members of the gang.
    fast = http.post(
        "/v1/chat/completions", json={"model": "ServiceAi-Fast", "messages": HI, "max_tokens": 2}
    )
    assert fast.status_code == 200, fast.text
    wait_until(lambda: all(gone(pid) for pid in gang), timeout_s=120, interval_s=1)
    serving_replica(stack, http, MODEL)
    assert not set(members(stack)) & set(gang)


async def _until_started(stream: httpx.Response, started: asyncio.Event):
    async for line in stream.aiter_lines():
        if line:
            yield line
            started.set()


def test_the_anthropic_sdk_streams_through_the_serving_processes(stack: Stack):
    client = anthropic.Anthropic(base_url=stack.origin, api_key=stack.api_key, max_retries=0)
    with client.messages.stream(model=MODEL, max_tokens=8, messages=HI) as stream:
        message = stream.get_final_message()
    assert message.usage.output_tokens > 0
    assert message.stop_reason in ("end_turn", "max_tokens")
