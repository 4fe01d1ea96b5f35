"""The embeddings benchmark's own arithmetic and what it starts (bench/embeddings.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from bench import embeddings
from bench.embeddings import ENGINE_SET_BY_NAME, embed_type, table, texts
from bench.servers import Server
from deployments.deployment_options import engine_kwargs
from deployments.model_type import ModelTypeConfig


def test_the_texts_are_distinct_and_the_same_in_every_round():
    first = texts(50, seed=1)
    assert len(set(first)) == 50 and first == texts(50, seed=1)
    assert first != texts(50, seed=2)


def test_both_servers_get_the_local_profiles_engine_args_and_bare_the_pooling_runner():
    config = ModelTypeConfig.model_validate(embed_type())
    kwargs = engine_kwargs(config, "/m")
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


def test_a_dropped_connection_is_tried_again_and_counted(monkeypatch: pytest.MonkeyPatch):
    """Bare vLLM once dropped a kept-alive connection at c=32 and the run stopped there."""
    calls = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise httpx.ReadError("connection reset", request=request)
        count = len(json.loads(request.content)["input"])
        data = [{"index": i, "embedding": [0.0]} for i in range(count)]
        return httpx.Response(200, json={"data": data, "usage": {"prompt_tokens": count}})

    real = httpx.AsyncClient
    monkeypatch.setattr(
        embeddings.httpx,
        "AsyncClient",
        lambda **kwargs: real(transport=httpx.MockTransport(answer), **kwargs),
    )
    server = Server("bare vLLM", "http://bare", "unused", "m")
    result = asyncio.run(embeddings.load(server, concurrency=1, requests=5, inputs=2, seed=0))
    assert result["retried"] == 1 and calls == embeddings.WARMUP + 5 + 1


def test_each_round_starts_one_server_later_and_keeps_every_servers_results(
    monkeypatch: pytest.MonkeyPatch,
):
    """With `--ray-llm` four servers share the run: each goes first in its turn, as the
    machine's speed drifts between minutes."""
    started: list[str] = []

    def contender(name: str):
        @contextlib.contextmanager
        def start():
            started.append(name)
            yield name

        return start

    async def load(server, concurrency, requests, inputs, seed):
        return {"server": server, "concurrency": concurrency, "round": seed}

    monkeypatch.setattr(embeddings, "load", load)
    names = ["bare vLLM", "ServiceAi", "Ray Serve LLM", "Ray Serve LLM direct"]
    runs = embeddings.measure({n: contender(n) for n in names}, rounds=3, inputs=1, scale=0.01)
    assert started[:4] == names and started[4:8] == names[1:] + names[:1]
    assert started[8] == "Ray Serve LLM" and len(started) == 12
    for name in names:
        assert [r["round"] for r in runs[name][1]] == [0, 1, 2]
        assert {r["server"] for r in runs[name][32]} == {name}


def test_ray_serve_llm_serves_the_embedding_model_with_the_pooling_runner(
    monkeypatch: pytest.MonkeyPatch, tmp_path
):
    seen = {}

    def ray_serve_llm(target, port, log_dir, direct, **options):
        seen.update(target=target, direct=direct, **options)
        return contextlib.nullcontext()

    monkeypatch.setattr(embeddings, "ray_serve_llm", ray_serve_llm)
    embeddings.ray_llm("/m", {"max_model_len": 2048}, tmp_path, direct=True)
    assert seen["target"].engine_args == {"max_model_len": 2048, "runner": "pooling"}
    assert seen["model_id"] == "ServiceAi-Embed" and seen["embeddings"] and seen["direct"]
    assert (
        seen["max_ongoing_requests"]
        == ModelTypeConfig.model_validate(embed_type()).max_ongoing_requests
    )


def test_the_model_is_the_local_profiles_a_generated_small_one_or_a_folder(tmp_path, monkeypatch):
    config = ModelTypeConfig.model_validate(embed_type())
    assert embeddings.embedding_model("tiny", config).endswith("/tiny-embed")
    assert embeddings.embedding_model(str(tmp_path), config) == str(tmp_path.resolve())
    assert embeddings.embedding_model("org/some-model", config) == "org/some-model"
    made = []
    monkeypatch.setattr(embeddings, "PROJECT_ROOT", tmp_path)
    monkeypatch.setattr(
        embeddings.tiny_model, "generate", lambda path, dims: made.append((path, dims))
    )
    assert embeddings.embedding_model("embed-small", config) == str(tmp_path / "models/embed-small")
    assert made == [(tmp_path / "models/embed-small", embeddings.tiny_model.EMBED_SMALL)]
