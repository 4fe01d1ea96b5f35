"""The embeddings benchmark's own arithmetic and what it starts (bench/embeddings.py)."""

from __future__ import annotations

from bench.embeddings import ENGINE_SET_BY_NAME, embed_type, table, texts
from deployments.model_type import ModelTypeConfig


def test_the_texts_are_distinct_and_the_same_in_every_round():
    first = texts(50, seed=1)
    assert len(set(first)) == 50 and first == texts(50, seed=1)
    assert first != texts(50, seed=2)


def test_both_servers_get_the_local_profiles_engine_args_and_bare_the_pooling_runner():
    config = ModelTypeConfig.model_validate(embed_type())
    kwargs = config.engine_kwargs("/m")
    assert kwargs["runner"] == "pooling"  # `vllm serve --runner pooling` for bare vLLM
    passed = {k: v for k, v in kwargs.items() if k not in ENGINE_SET_BY_NAME}
    assert passed["max_model_len"] == 2048 and "runner" not in passed


def test_the_table_compares_each_server_with_bare_at_each_concurrency():
    def run(rate: float) -> dict:
        return {
            "embeddings_per_s": rate,
            "tokens_per_s": 20 * rate,
            "latency": {"p50_ms": 1.0, "p99_ms": 2.0},
        }

    runs = {
        "bare vLLM": {1: [run(100), run(120), run(110)], 32: [run(200)]},
        "ServiceAi": {1: [run(55), run(50), run(60)], 32: [run(190)]},
    }
    rows = table(runs, inputs=1).splitlines()
    assert "| 1 | ServiceAi | 55.0 | 1100 | 1.0 | 2.0 | 0.50x |" in rows
    assert "| 32 | ServiceAi | 190.0 | 3800 | 1.0 | 2.0 | 0.95x |" in rows
