"""No request kills an engine; an engine that dies anyway is a 503 to every request it held.

A seed with prompts long enough to be prefilled in chunks killed vLLM's CPU engine
(deployments/vllm_engine/seeded_sampling.py): the same load must leave the engine core running and give
each seeded request the reply it gets alone.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import psutil

from tests.conftest import Stack, error_of
from tests.e2e.conftest import prompt_tokens
from tests.e2e.processes import engine_requests, gone, serving_replica, wait_until

WORDS = "the quick brown fox jumps over lazy dog hello how are you today fine thank".split()
SEEDED_REQUESTS = 16
HI = [{"role": "user", "content": "hi"}]
PROMPT_TOKENS = 1500  # of the Fast type's 2,048: a prefill of several such is chunked


def fresh_prompt(tokenizer, index: int) -> list[dict[str, str]]:
    """A user message of about PROMPT_TOKENS tokens that no other request shares a prefix with."""
    rng = random.Random(f"{time.time_ns()}-{index}")
    words = [str(rng.randrange(10**6))]
    while prompt_tokens(tokenizer, [{"role": "user", "content": " ".join(words)}]) < PROMPT_TOKENS:
        words.extend(rng.choice(WORDS) for _ in range(100))
    return [{"role": "user", "content": " ".join(words)}]


async def _chat(stack: Stack, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(
        base_url=stack.origin, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=120
    ) as client:
        return await client.post("/v1/chat/completions", json=body)


def test_seeded_requests_with_fresh_long_prompts_leave_the_engine_running(stack, http, tokenizer):
    model = "ServiceAi-Fast"
    before = serving_replica(stack, http, model)
    bodies = [
        {
            "model": model,
            "messages": fresh_prompt(tokenizer, i),
            "temperature": 0.7,
            "seed": 1000 + i,
            "max_tokens": 24,
            "ignore_eos": True,
        }
        for i in range(SEEDED_REQUESTS)
    ]

    async def all_at_once() -> list[httpx.Response]:
        return await asyncio.gather(*(_chat(stack, body) for body in bodies))

    replies = asyncio.run(all_at_once())
    assert [r.status_code for r in replies] == [200] * SEEDED_REQUESTS, [
        r.text[:200] for r in replies if r.status_code != 200
    ]
    assert [p.pid for p in before.engine_cores] == [
        p.pid for p in serving_replica(stack, http, model).engine_cores
    ]
    assert all(p.is_running() and not gone(p.pid) for p in before.engine_cores)
    # The seed still decides the reply: alone (its prompt now cached, prefilled at once), each
    # request gets the words it got while its prefill was chunked among fifteen others.
    for body, reply in list(zip(bodies, replies))[:4]:
        again = http.post("/v1/chat/completions", json=body)
        assert again.json()["choices"][0]["message"] == reply.json()["choices"][0]["message"]


def test_requests_held_by_an_engine_that_dies_are_told_to_retry(stack, http):
    """Whole replies and streams in flight when the engine core dies, and every kind of
    request sent to it before Serve replaces it: 503 model_unavailable with Retry-After
    (a stream that had begun: the error event, then [DONE]); never a 500."""
    model = "ServiceAi-Pro"
    processes = serving_replica(stack, http, model)
    long = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 1500,
        "ignore_eos": True,
    }

    async def in_flight(client: httpx.AsyncClient) -> tuple[list[httpx.Response], list[str]]:
        whole = [
            asyncio.ensure_future(client.post("/v1/chat/completions", json=long)) for _ in range(3)
        ]
        async with client.stream(
            "POST", "/v1/chat/completions", json={**long, "stream": True}
        ) as stream:
            lines = stream.aiter_lines()
            for _ in range(3):
                await anext(lines)
            await asyncio.to_thread(
                wait_until,
                lambda: engine_requests(stack, model) >= 4,
                30,
            )
            for core in processes.engine_cores:
                core.kill()
            rest = [line async for line in lines if line]
        return list(await asyncio.gather(*whole)), rest

    async def sent_after(client: httpx.AsyncClient) -> list[httpx.Response]:
        hi = {"model": model, "max_tokens": 5}
        return list(
            await asyncio.gather(
                client.post("/v1/chat/completions", json={**hi, "messages": HI}),
                client.post("/v1/chat/completions", json={**hi, "messages": HI, "stream": True}),
                # Long enough that a replica measures the prompt before admission.
                client.post(
                    "/v1/chat/completions",
                    json={**hi, "messages": [{"role": "user", "content": "hi " * 1200}]},
                ),
                client.post("/v1/completions", json={**hi, "prompt": "hi"}),
                client.post("/v1/responses", json={"model": model, "input": "hi"}),
                client.post("/v1/responses", json={"model": model, "input": "hi", "stream": True}),
            )
        )

    async def both() -> tuple[list[httpx.Response], list[str], list[httpx.Response]]:
        async with httpx.AsyncClient(
            base_url=stack.origin,
            headers={"Authorization": f"Bearer {stack.api_key}"},
            timeout=120,
        ) as client:
            whole, stream = await in_flight(client)
            return whole, stream, await sent_after(client)

    whole, stream, after = asyncio.run(both())
    for response in [*whole, *after]:
        assert error_of(response, 503)["code"] == "model_unavailable", response.request.content
        assert int(response.headers["retry-after"]) > 0
    assert stream[-1] == "data: [DONE]"
    assert json.loads(stream[-2].removeprefix("data: "))["error"]["code"] == "model_unavailable"
    wait_until(
        lambda: (
            not processes.replica.is_running() or processes.replica.status() == psutil.STATUS_ZOMBIE
        ),
        timeout_s=120,
        interval_s=1,
    )
    assert serving_replica(stack, http, model).replica.pid != processes.replica.pid
