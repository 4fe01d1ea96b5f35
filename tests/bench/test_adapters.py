"""The adapters benchmark's own arithmetic and what it starts (bench/adapters.py)."""

from __future__ import annotations

from bench.adapters import LORA_ARGS, SPREADS, model_type, models_of, table
from deployments.deployment_options import engine_kwargs
from deployments.model_type import ModelTypeConfig


def test_requests_spread_over_the_base_or_the_first_adapters_as_both_servers_name_them():
    names = [f"a{i}" for i in range(16)]
    assert models_of(0, names) == ["ServiceAi-Fast"]
    assert models_of(4, names) == [f"ServiceAi-Fast:a{i}" for i in range(4)]


def test_the_service_and_bare_vllm_get_the_same_adapters_and_lora_sizes():
    entry = model_type({"a0": "/x/a0", "a1": "/x/a1"})
    config = ModelTypeConfig.model_validate(entry)
    assert config.adapter_paths() == {"ServiceAi-Fast:a0": "/x/a0", "ServiceAi-Fast:a1": "/x/a1"}
    kwargs = engine_kwargs(config, "/m")
    assert kwargs["enable_lora"] is True
    assert {k: kwargs[k] for k in LORA_ARGS} == LORA_ARGS


def test_the_table_has_a_row_per_spread_with_the_services_ratio():
    runs = {
        "bare vLLM": {s: [{"output_tok_s": 100.0}, {"output_tok_s": 120.0}] for s in SPREADS},
        "ServiceAi": {s: [{"output_tok_s": 99.0}, {"output_tok_s": 121.0}] for s in SPREADS},
    }
    rows = table(runs).splitlines()
    assert "| none (base model) | 110 | 110 | 1.00 |" in rows
    assert "| 16 | 110 | 110 | 1.00 |" in rows
