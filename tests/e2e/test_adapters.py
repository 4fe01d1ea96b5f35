"""LoRA adapters on the real stack: a type of its own (the tiny model with two random adapters
written by `peft`) in an application over the running cluster; clients call `Type:adapter`."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import torch

from deployments.model_type import tiny_model_dir
from tests.conftest import Stack, app_args, error_of
from tests.e2e.test_key_scopes import scoped_key
from tests.e2e.test_limits import ingress_app, usage_of

TUNED = "ServiceAi-Tuned"
ADAPTERS = ("acme", "beta")
HELLO = [{"role": "user", "content": "hello there"}]


def write_adapter(out: Path, seed: int) -> Path:
    """A rank-8 LoRA of the tiny model's attention, random (not zero) on both sides, so that
    its output differs from the base model's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    get_peft_model(base, config).save_pretrained(out)
    return out


def tuned_type(folder: Path) -> dict:
    """ServiceAi-Fast's settings under another name, with the two adapters; the engine holds
    one adapter at a time (max_loras 1), as a GPU short of memory would."""
    fast = next(m for m in app_args()["model_types"] if m["name"] == "ServiceAi-Fast")
    adapters = [
        {"name": name, "path": str(write_adapter(folder / name, seed))}
        for seed, name in enumerate(ADAPTERS, 1)
    ]
    engine_args = {**fast["engine_args"], "max_loras": 1, "max_lora_rank": 8}
    return {**fast, "name": TUNED, "adapters": adapters, "engine_args": engine_args}


@pytest.fixture(scope="module")
def tuned(stack: Stack, tmp_path_factory) -> str:
    """The base URL of an application with the adapted type."""
    plans = app_args()["plans"]
    for plan in plans.values():
        plan[TUNED] = plan["ServiceAi-Fast"]
    folder = tmp_path_factory.mktemp("adapters")
    with ingress_app(
        stack, "tuned", models_app=None, model_types=[tuned_type(folder)], plans=plans
    ) as base_url:
        yield base_url


def greedy(client: openai.OpenAI, model: str) -> tuple[str, list[float]]:
    reply = client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=8, temperature=0, logprobs=True
    )
    assert reply.model == model
    return reply.choices[0].message.content, [t.logprob for t in reply.choices[0].logprobs.content]


def test_each_adapter_answers_as_itself(stack: Stack, tuned: str):
    client = openai.OpenAI(base_url=tuned, api_key=stack.api_key, max_retries=0)
    base = greedy(client, TUNED)
    acme = greedy(client, f"{TUNED}:acme")
    beta = greedy(client, f"{TUNED}:beta")
    assert acme != base and beta != base and acme != beta
    # Alternating with one engine slot for adapters: each comes back as it was.
    assert greedy(client, f"{TUNED}:acme") == acme
    assert greedy(client, TUNED) == base
    assert greedy(client, f"{TUNED}:beta") == beta


def test_models_lists_the_adapters_and_an_unknown_one_is_a_404(stack: Stack, tuned: str):
    client = openai.OpenAI(base_url=tuned, api_key=stack.api_key, max_retries=0)
    ids = [m.id for m in client.models.list().data]
    assert ids[ids.index(TUNED) :][:3] == [TUNED, f"{TUNED}:acme", f"{TUNED}:beta"]
    assert client.models.retrieve(f"{TUNED}:beta").id == f"{TUNED}:beta"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(f"{TUNED}:gamma")
    with httpx.Client(headers={"Authorization": f"Bearer {stack.api_key}"}) as http:
        body = {"model": f"{TUNED}:gamma", "messages": HELLO, "max_tokens": 2}
        error = error_of(http.post(f"{tuned}/chat/completions", json=body), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert f"{TUNED}:acme, {TUNED}:beta" in error["message"]


def test_a_key_scoped_to_an_adapter_calls_that_adapter_alone_and_its_usage(
    stack: Stack, tuned: str
):
    key = scoped_key(stack, "--models", f"{TUNED}:acme")
    client = openai.OpenAI(base_url=tuned, api_key=key["key"], max_retries=0)
    assert [m.id for m in client.models.list().data] == [f"{TUNED}:acme"]
    for refused in (TUNED, f"{TUNED}:beta"):
        with pytest.raises(openai.PermissionDeniedError) as denied:
            client.chat.completions.create(model=refused, messages=HELLO, max_tokens=2)
        assert denied.value.body["code"] == "model_not_allowed"
    reply = client.chat.completions.create(model=f"{TUNED}:acme", messages=HELLO, max_tokens=4)
    usage = usage_of(tuned, key["key"], 1)
    assert usage == {
        "requests": 1,
        "prompt_tokens": reply.usage.prompt_tokens,
        "completion_tokens": reply.usage.completion_tokens,
        "models": [f"{TUNED}:acme"],
    }
