"""One machine's GPUs shared by the four model types: the arithmetic for 24, 48 and 80 GB cards,
one to eight of them, the refusal that names what does not fit, the parsers of each model's
family, and a serve config whose every type vLLM's engine arguments accept. No GPU needed; the
profile runs for real where bench/gpu has one."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from app.cli.gpu_profile import serve_config
from app.cli.main import cli
from deployments.deployment_options import engine_kwargs
from deployments.gpu_profile import (
    DEFAULT_MODELS,
    USABLE,
    ModelSpec,
    ProfileError,
    default_models,
    model_for,
    model_type_entry,
    plan,
)
from deployments.model_families import UnknownFamily, parsers_for
from deployments.model_type import ModelTypeConfig
from deployments.tiny_model import ensure

GIB = 1 << 30
CARDS = {"L4": 22.49, "RTX 4090": 23.99, "L40S": 44.99, "A100 80GB": 80.0, "H100": 79.6}


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_every_gpu_holds_what_its_engines_take_and_each_type_its_need(card, gpus):
    memory = CARDS[card]
    placed = plan(default_models(memory), gpus, memory)

    assert sorted(p.name for p in placed.placements) == sorted(DEFAULT_MODELS[22.0])
    for gpu in range(gpus):
        assert placed.used(gpu) <= USABLE
        on_it = [p for p in placed.placements if gpu in p.gpus]
        assert sum(model_type_entry(p)["num_gpus_per_shard"] for p in on_it) <= 1
    for placement in placed.placements:
        assert placement.share * memory >= placement.spec.need_gib() - 1e-3, placement.name


def test_one_card_shares_its_memory_in_proportion_to_need():
    placed = plan(default_models(22.49), 1, 22.49)

    shares = {p.name: p.share for p in placed.placements}
    assert sum(shares.values()) == pytest.approx(USABLE, abs=1e-3)
    assert shares["ServiceAi-Pro"] > shares["ServiceAi-Coder"] > shares["ServiceAi-Fast"]


def test_spare_gpus_give_each_type_a_gpu_of_its_own():
    placed = plan(default_models(44.99), 4, 44.99)
    assert sorted(g for p in placed.placements for g in p.gpus) == [0, 1, 2, 3]


def test_a_model_larger_than_a_gpu_is_tensor_parallel_over_whole_gpus():
    big = ModelSpec("Qwen/Qwen3-32B", 32.8, 2 * 64 * 8 * 128 * 2, 32768, 2)
    models = {**default_models(79.6), "ServiceAi-Pro": big}

    placed = plan(models, 4, 44.99)

    [pro] = [p for p in placed.placements if p.name == "ServiceAi-Pro"]
    assert len(pro.gpus) == 2 and pro.share == USABLE
    entry = model_type_entry(pro)
    assert (entry["tensor_parallel_size"], entry["num_gpus_per_shard"]) == (2, 1)


def test_what_does_not_fit_is_named_with_what_to_change():
    with pytest.raises(ProfileError) as refused:
        plan(default_models(16.0), 1, 16.0)
    message = str(refused.value)
    assert "ServiceAi-Coder" in message and "needs 4.7 GiB" in message
    assert "SERVICEAI_MODEL_" in message


def test_each_default_model_gets_its_familys_parsers():
    assert parsers_for("Qwen/Qwen3-14B").reasoning_parser == "qwen3"
    assert parsers_for("Qwen/Qwen2.5-Coder-7B-Instruct").tool_call_parser == "hermes"
    assert parsers_for("meta-llama/Llama-3.1-8B-Instruct").tool_call_parser == "llama3_json"
    assert parsers_for("Qwen/Qwen3-Embedding-0.6B").embed
    with pytest.raises(UnknownFamily, match="tool_call_parser and reasoning_parser"):
        parsers_for("acme/unknown-7b")


@pytest.mark.parametrize("memory", [22.49, 44.99, 79.6])
def test_the_profiles_serve_config_is_one_vllm_and_the_service_accept(memory):
    from vllm.engine.arg_utils import AsyncEngineArgs

    config = serve_config(plan(default_models(memory), 1, memory))
    [app] = config["applications"]
    assert app["args"]["plans"]["free"]  # the local profile's plans, kept
    for entry in app["args"]["model_types"]:
        model_type = ModelTypeConfig.model_validate(entry)
        assert model_type.resolved_model({"SERVICEAI_MODEL_FAST": "other"}) == entry["model"]
        args = AsyncEngineArgs(**engine_kwargs(model_type, model_type.model))
        assert 0 < args.gpu_memory_utilization < USABLE
        assert args.tensor_parallel_size == 1 and args.enable_prefix_caching


def test_a_types_variable_names_another_model_sized_from_its_folder(tmp_path):
    folder = ensure(tmp_path / "tiny")
    spec = model_for("ServiceAi-Fast", str(folder), default_models(22.49))

    config = json.loads((folder / "config.json").read_text())
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert spec.parameters == pytest.approx(weights / 2e9)
    assert spec.kv_bytes_per_token == 2 * config["num_hidden_layers"] * 2 * (
        config["hidden_size"] // config["num_attention_heads"]
    ) * config.get("num_key_value_heads", config["num_attention_heads"])
    with pytest.raises(ProfileError, match="Download it first"):
        model_for("ServiceAi-Fast", "acme/not-here", default_models(22.49))


def test_the_cli_writes_the_profile_or_names_what_does_not_fit(tmp_path):
    output = tmp_path / "serve_config.gpu.yaml"
    runner = CliRunner()

    written = runner.invoke(
        cli, ["gpu-profile", "--gpus", "1", "--gpu-memory-gib", "22.49", "--output", str(output)]
    )
    assert written.exit_code == 0, written.output
    types = yaml.safe_load(output.read_text())["applications"][0]["args"]["model_types"]
    assert [t["name"] for t in types] == [
        "ServiceAi-Fast",
        "ServiceAi-Pro",
        "ServiceAi-Coder",
        "ServiceAi-Embed",
    ]
    refused = runner.invoke(cli, ["gpu-profile", "--gpus", "1", "--gpu-memory-gib", "12"])
    assert refused.exit_code == 2 and "needs" in refused.output
