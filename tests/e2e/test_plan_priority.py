"""Plan-aware priority (deployments.priority_gate): on a type whose engine schedules by
priority, a pro request under a free flood starts at once, in a slot kept for it, and
priorities with several choices (`n`) leave the engine alive (vllm#29747)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import openai
import pytest
from ray import serve

from app.builder import build_app
from tests.conftest import app_args
from tests.e2e.conftest import async_clients, serviceai_cli

APP = "priority"
SLOTS = 8
RESERVED = 2
FLOOD = 16
LONG = 300


@pytest.fixture(scope="module")
def priority_app(stack):
    """(base URL, free key, pro key) of an application whose ServiceAi-Fast engine schedules
    by priority with 8 slots, 2 of them kept for the first plan."""
    args = app_args()
    fast = args["model_types"][0]
    fast = dict(
        fast,
        num_cpus=0.25,
        max_ongoing_requests=4 * SLOTS,
        reserved_slots=RESERVED,
        engine_args={**fast["engine_args"], "max_num_seqs": SLOTS, "scheduling_policy": "priority"},
    )
    args = dict(args, model_types=[fast])
    args["plans"] = {
        name: {"priority": plan.get("priority", 0), "ServiceAi-Fast": plan["ServiceAi-Fast"]}
        for name, plan in args["plans"].items()
    }
    args["ingress"] = dict(
        args["ingress"], num_cpus=0.25, env_vars={"SERVICEAI_DATABASE_URL": stack.database_url}
    )
    keys = {}
    for plan in ("free", "pro"):
        created = serviceai_cli(
            stack.database_url,
            "users",
            "create",
            "--email",
            f"{plan}-{uuid.uuid4().hex[:8]}@example.com",
            "--plan",
            plan,
            "--with-key",
            "--json",
        )
        keys[plan] = created["key"]["key"]
        stack.secrets.append(keys[plan])
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    try:
        yield f"{stack.origin}/{APP}/v1", keys["free"], keys["pro"]
    finally:
        serve.delete(APP)


@pytest.fixture
async def plan_clients(priority_app) -> AsyncIterator[tuple[openai.AsyncOpenAI, ...]]:
    """(free, pro) clients of the priority app, closed when the test ends (see
    tests/e2e/conftest.py: `async_clients`)."""
    base_url, free_key, pro_key = priority_app
    async with async_clients(base_url, free_key, pro_key) as clients:
        yield clients


def test_the_plans_name_their_priorities():
    plans = app_args()["plans"]
    assert plans["pro"]["priority"] < plans["free"]["priority"]


@pytest.mark.parametrize("n", [1, 2])
async def test_a_pro_request_starts_at_once_under_a_free_flood(plan_clients, n):
    """Also when the free requests ask for several choices: each takes a slot per choice."""
    free, pro = plan_clients
    started: list[int] = []
    finished: list[int] = []

    async def flood_one(number: int) -> None:
        stream = await free.chat.completions.create(
            model="ServiceAi-Fast",
            messages=[{"role": "user", "content": f"flood {number}"}],
            max_tokens=LONG,
            stream=True,
            n=n,
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if chunk.choices and number not in started:
                started.append(number)
        finished.append(number)

    flood = [asyncio.ensure_future(flood_one(number)) for number in range(FLOOD // n)]
    # The free requests fill every slot but the reserved ones; the rest wait at the gate.
    running = (SLOTS - RESERVED) // n
    while len(started) < running:
        await asyncio.sleep(0.05)
    stream = await pro.chat.completions.create(
        model="ServiceAi-Fast",
        messages=[{"role": "user", "content": "pro"}],
        max_tokens=30,
        stream=True,
    )
    async for chunk in stream:
        if chunk.choices:
            break
    # Its first token came while every free request that had started still ran.
    assert finished == [] and len(started) == running
    async for _ in stream:
        pass
    await asyncio.gather(*flood)
    assert sorted(finished) == list(range(FLOOD // n))  # free requests are still all served


async def test_priorities_with_several_choices_leave_the_engine_alive(plan_clients):

    async def one(client: openai.AsyncOpenAI, n: int, stream: bool) -> int:
        reply = await client.chat.completions.create(
            model="ServiceAi-Fast",
            messages=[{"role": "user", "content": "several"}],
            max_tokens=40,
            n=n,
            stream=stream,
            temperature=1.0,
        )
        if not stream:
            return len(reply.choices)
        return len({c.index async for chunk in reply for c in chunk.choices})

    calls = [
        one(client, n, stream)
        for client in plan_clients
        for n in (1, 2, 4)
        for stream in (False, True)
    ]
    assert await asyncio.gather(*calls * 2) == [1, 1, 2, 2, 4, 4] * 4
    completion = await plan_clients[1].completions.create(
        model="ServiceAi-Fast", prompt="still alive", max_tokens=4, n=3
    )
    assert len(completion.choices) == 3


async def test_on_a_busy_engine_free_streams_come_in_larger_chunks_and_pro_token_by_token(
    plan_clients,
):
    """A free stream that starts while the free requests fill their slots gets 8 tokens a
    chunk (busy_stream_interval's default): the same tokens in fewer chunks through every
    layer. The first plan's stream still gets a chunk per token."""
    free, pro = plan_clients

    async def chunks(client: openai.AsyncOpenAI, text: str, tokens: int) -> tuple[int, int]:
        """(chunks with text, completion tokens) of one stream."""
        stream = await client.chat.completions.create(
            model="ServiceAi-Fast",
            messages=[{"role": "user", "content": text}],
            max_tokens=tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        count = used = 0
        async for chunk in stream:
            count += any(c.delta.content for c in chunk.choices)
            if chunk.usage:
                used = chunk.usage.completion_tokens
        return count, used

    flood = [asyncio.ensure_future(chunks(free, f"flood {n}", LONG)) for n in range(FLOOD)]
    first, first_tokens = await chunks(pro, "pro", 30)
    floods = await asyncio.gather(*flood)
    assert first_tokens == 30 and first > 30 // 4  # 8 tokens a chunk would give 5 at most
    assert all(tokens == LONG for _, tokens in floods)
    # Those that waited at the gate started on a busy engine.
    chunked = [count for count, _ in floods if count <= LONG // 8 + 2]
    assert len(chunked) >= FLOOD - SLOTS, floods
