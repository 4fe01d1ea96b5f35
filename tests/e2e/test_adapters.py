"""LoRA adapters on the real stack: a type of its own (the tiny model with two random adapters
written by `peft`, two replicas) in an application over the running cluster; clients call
`Type:adapter`. A third adapter is registered through the admin API while it runs: its home
replica loads it once, whatever the burst."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch
from ray import serve

from deployments.model_type import tiny_model_dir
from tests.conftest import Stack, app_args, error_of
from tests.e2e.test_key_scopes import scoped_key
from tests.e2e.test_limits import ingress_app, usage_of
from tests.e2e.test_observability import scrape

TUNED = "ServiceAi-Tuned"
ADAPTERS = ("acme", "beta")
HELLO = [{"role": "user", "content": "hello there"}]
LOADS = "ray_serviceai_adapter_loads_total"


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
    """ServiceAi-Fast's settings under another name, with the two adapters, on two replicas;
    each engine holds one adapter at a time (max_loras 1), as a GPU short of memory would."""
    fast = next(m for m in app_args()["model_types"] if m["name"] == "ServiceAi-Fast")
    adapters = [
        {"name": name, "path": str(write_adapter(folder / name, seed))}
        for seed, name in enumerate(ADAPTERS, 1)
    ]
    engine_args = {**fast["engine_args"], "max_loras": 1, "max_lora_rank": 8}
    return {
        **fast,
        "name": TUNED,
        "adapters": adapters,
        "engine_args": engine_args,
        "num_replicas": 2,
        "num_cpus": 0.25,
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("adapters")


@pytest.fixture(scope="module")
def tuned(stack: Stack, folder: Path) -> str:
    """The base URL of an application with the adapted type."""
    plans = app_args()["plans"]
    for plan in plans.values():
        plan[TUNED] = plan["ServiceAi-Fast"]
    with ingress_app(
        stack, "tuned", models_app=None, model_types=[tuned_type(folder)], plans=plans
    ) as base_url:
        assert serve.status().applications["tuned"].deployments[TUNED].replica_states == {
            "RUNNING": 2
        }
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
    # It names no adapter (a key scoped to one learns no other's): /v1/models lists them.
    assert "acme" not in error["message"] and "GET /v1/models" in error["message"]


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


def loads_logged(stack: Stack, adapter: str) -> int:
    """How many times the type's replicas logged loading `adapter` (each load is logged once,
    before the request that needed it goes on)."""
    line = f"Loaded LoRA adapter {adapter} from"
    return sum(
        p.read_text(errors="replace").count(line)
        for p in stack.log_files()
        if p.name.startswith(f"replica_tuned_{TUNED}_")
    )


def test_an_adapter_registered_at_run_time_is_loaded_once_by_its_home_replica(
    stack: Stack, tuned: str, folder: Path
):
    gamma = f"{TUNED}:gamma"
    client = openai.OpenAI(base_url=tuned, api_key=stack.api_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=gamma, messages=HELLO, max_tokens=2)
    admin = httpx.Client(
        base_url=tuned.removesuffix("/v1"),
        headers={"Authorization": f"Bearer {stack.admin_token}"},
        timeout=30,
    )
    path = str(write_adapter(folder / "gamma", seed=3))
    registered = admin.post("/admin/adapters", json={"model": TUNED, "name": "gamma", "path": path})
    assert registered.status_code == 201, registered.text
    assert gamma in [m.id for m in client.models.list().data]

    # A burst on the new adapter (below the router's max_imbalance): one replica loads it.
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: greedy(client, gamma), range(6)))
    assert len(set(map(str, replies))) == 1
    assert replies[0] != greedy(client, TUNED)
    assert greedy(client, gamma) == replies[0]  # after the base model took the slot
    assert loads_logged(stack, gamma) == 1
    deadline = time.monotonic() + 30
    while scrape(stack)[(LOADS, (("model_type", TUNED), ("adapter", gamma)))] < 1:
        assert time.monotonic() < deadline, "serviceai_adapter_loads never reached Prometheus"
        time.sleep(0.5)

    # Whole replies, streams and prompt measures on every API that generates take it too.
    streamed = client.chat.completions.create(
        model=gamma, messages=HELLO, max_tokens=4, stream=True
    )
    assert any(chunk.model == gamma for chunk in streamed)
    assert client.responses.create(model=gamma, input="hello", max_output_tokens=4).model == gamma
    assert client.completions.create(model=gamma, prompt="hello", max_tokens=2).model == gamma

    key = scoped_key(stack, "--models", gamma)
    scoped = openai.OpenAI(base_url=tuned, api_key=key["key"], max_retries=0)
    assert [m.id for m in scoped.models.list().data] == [gamma]
    with pytest.raises(openai.PermissionDeniedError):
        scoped.chat.completions.create(model=f"{TUNED}:acme", messages=HELLO, max_tokens=2)

    assert admin.delete(f"/admin/adapters/{gamma}").status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=gamma, messages=HELLO, max_tokens=2)
    assert loads_logged(stack, gamma) == 1
