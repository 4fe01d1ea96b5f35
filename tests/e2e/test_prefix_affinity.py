"""Prefix-cache affinity across replicas (deployments.request_router): with two replicas of a
type behind two ingress replicas (each with its own router, as in production), every later
turn of a conversation lands where its earlier turns' prefix is cached, whichever ingress
replica it passes through, on chat and on /v1/responses with `previous_response_id`."""

from __future__ import annotations

import random
import time

import openai
import pytest
from ray import serve

from app.builder import build_app
from tests.conftest import app_args
from tests.e2e.test_observability import scrape

APP = "affinity"
CONVERSATIONS = 6
TURNS = 3


@pytest.fixture(scope="module")
def two_replicas(stack):
    """A base URL of an application of two ingress replicas whose ServiceAi-Fast runs two
    replicas."""
    args = app_args()
    fast = dict(args["model_types"][0], num_replicas=2, num_cpus=0.25)
    args = dict(args, model_types=[fast])
    args["plans"] = {
        name: {"ServiceAi-Fast": plan["ServiceAi-Fast"]} for name, plan in args["plans"].items()
    }
    args["ingress"] = dict(
        args["ingress"],
        num_replicas=2,
        num_cpus=0.25,
        env_vars={"SERVICEAI_DATABASE_URL": stack.database_url},
    )
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    try:
        deployments = serve.status().applications[APP].deployments
        for name in ("Ingress", "ServiceAi-Fast"):
            assert deployments[name].replica_states == {"RUNNING": 2}, name
        yield f"{stack.origin}/{APP}/v1"
    finally:
        serve.delete(APP)


def system_prompt(rng: random.Random) -> str:
    """Some 600 tokens no other conversation shares."""
    return " ".join(f"{rng.choice('abcdefghij')}{rng.randrange(1000)}" for _ in range(300))


def test_every_later_turn_finds_its_conversation_cached(stack, two_replicas):
    client = openai.OpenAI(base_url=two_replicas, api_key=stack.api_key, max_retries=0)
    before = affinity_decisions(stack)
    rng = random.Random(32)
    conversations = [
        [{"role": "system", "content": system_prompt(rng)}] for _ in range(CONVERSATIONS)
    ]
    misses = []
    for turn in range(TURNS):
        for number, messages in enumerate(conversations):
            messages.append({"role": "user", "content": f"turn {turn} of {number}"})
            reply = client.chat.completions.create(
                model="ServiceAi-Fast", messages=messages, max_tokens=8, temperature=0
            )
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            cached = reply.usage.prompt_tokens_details.cached_tokens
            # Only a conversation's own earlier turns share more than a block with it.
            if turn and not cached:
                misses.append((number, turn))
    assert misses == []

    # The router counts its decisions (Ray exports them every second or so).
    deadline = time.monotonic() + 30
    while affinity_decisions(stack) - before < CONVERSATIONS * (TURNS - 1):
        assert time.monotonic() < deadline, affinity_decisions(stack) - before
        time.sleep(0.5)


def affinity_decisions(stack) -> float:
    series = (
        "ray_serviceai_router_decisions_total",
        (("model_type", "ServiceAi-Fast"), ("decision", "affinity")),
    )
    return scrape(stack)[series]


def test_previous_response_id_continues_on_the_replica_that_served_it(stack, two_replicas):
    client = openai.OpenAI(base_url=two_replicas, api_key=stack.api_key, max_retries=0)
    rng = random.Random(33)
    for _ in range(4):
        # (Instructions are not carried to the next turn: the long part is in the input.)
        previous = client.responses.create(
            model="ServiceAi-Fast", input=system_prompt(rng), max_output_tokens=8
        )
        for turn in range(2):
            previous = client.responses.create(
                model="ServiceAi-Fast",
                previous_response_id=previous.id,
                input=f"turn {turn}",
                max_output_tokens=8,
            )
            assert previous.usage.input_tokens_details.cached_tokens > 0
