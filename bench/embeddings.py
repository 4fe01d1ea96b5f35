"""Embeddings through the service against bare vLLM on the same model (`make bench-embeddings`).

One run, the servers in turn, each alone on the machine: bare `vllm serve --runner pooling`
and this service's ServiceAi-Embed (`serve run` of the local profile with that type alone, a
plan that never refuses), with `--ray-llm` also Ray Serve LLM in both its modes (its default
ingress, and direct streaming: HAProxy straight into the replica that runs vLLM's own app, the
least a Serve deployment puts on a request's path). The model is the local profile's generated
embedding model, or with `--model embed-small` a generated one of a small real embedding
model's size, whose own time per request is several times the path's (or a model's folder),
with the local profile's engine arguments. At each concurrency, clients send POST
/v1/embeddings back to back, each request `--inputs` texts of ~24 tokens (distinct: no cache
helps); per server the embeddings per second, the input tokens per second (the servers' own
`usage`) and the latency p50/p99, in `--rounds` rounds that rotate the servers' order (this
machine's speed drifts between minutes). Results: bench/results/<stamp>-embeddings[-model].json
and a table on stdout (bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.priority import percentiles
from bench.run import RAY_LLM_MODES, RESULTS, STACK_LOCK
from bench.servers import (
    BENCH_LIMITS,
    PROJECT_ROOT,
    SERVE_CONFIG,
    BenchTarget,
    Server,
    engine_cli_args,
    free_port,
    local_service,
    ray_serve_llm,
    stop_servers_on_sigterm,
    vllm_command,
    vllm_server,
)
from deployments import tiny_model
from deployments.deployment_options import engine_kwargs
from deployments.model_type import ModelTypeConfig, generated_model

EMBED = "ServiceAi-Embed"
CONCURRENCIES = (1, 32)
REQUESTS = {1: 600, 32: 3000}
WARMUP = 20
TRANSPORT_TRIES = 3
"""Tries of a request whose connection failed (bare vLLM once dropped a kept-alive one at c=32
and stopped the run); the latency counts from the first, and the result says how many."""
ENGINE_SET_BY_NAME = {"model", "tokenizer", "served_model_name", "runner"}
"""Given to `vllm serve` as flags of their own (bare_vllm), not as engine args."""
WORDS = "the quick brown fox jumps over a lazy dog while ray serve scales vllm replicas".split()


def embed_type() -> dict[str, Any]:
    """The local profile's embedding type, as serve_config.yaml has it."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    [app] = config["applications"]
    return next(m for m in app["args"]["model_types"] if m["name"] == EMBED)


def texts(count: int, seed: int) -> list[str]:
    """`count` distinct texts of 12 words and a number each (~24 tokens of the tiny model)."""
    rng = random.Random(seed)
    return [f"{i} " + " ".join(rng.choices(WORDS, k=12)) for i in range(count)]


def bare_vllm(
    model: str, engine_args: dict[str, Any], log_dir: Path
) -> AbstractContextManager[Server]:
    """`vllm serve` of the embedding model with vLLM's pooling runner."""
    port = free_port()
    flags = ["--runner", "pooling", *engine_cli_args(engine_args)]
    command = vllm_command(model, EMBED, port, flags)
    return vllm_server(command, port, log_dir / "bare-vllm-embed.log", embeddings=True)


def ray_llm(
    model: str, engine_args: dict[str, Any], log_dir: Path, direct: bool
) -> AbstractContextManager[Server]:
    """Ray Serve LLM serving the embedding model (`direct`: its direct streaming mode)."""
    target = BenchTarget(model=model, engine_args={**engine_args, "runner": "pooling"})
    ongoing = ModelTypeConfig.model_validate(embed_type()).max_ongoing_requests
    return ray_serve_llm(
        target,
        free_port(),
        log_dir,
        direct,
        model_id=EMBED,
        embeddings=True,
        max_ongoing_requests=ongoing,
    )


def serviceai(log_dir: Path, model: str) -> AbstractContextManager[Server]:
    """The service as `make run` starts it, with the embedding type alone, on `model`."""
    plan = {**BENCH_LIMITS, "input_tokens_per_request": 10**6}
    entry = {**embed_type(), "model_env": None, "model": model}
    return local_service(entry, plan, log_dir / "serviceai-embed.log", embeddings=True)


async def load(server: Server, concurrency: int, requests: int, inputs: int, seed: int) -> dict:
    """`requests` embedding requests of `inputs` texts each, `concurrency` at a time."""
    batches = [texts(inputs, seed * 100_000 + i * inputs) for i in range(requests + WARMUP)]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {server.api_key}"}
    latencies: list[float] = []
    tokens = retried = 0
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=headers, limits=limits, timeout=120
    ) as client:

        async def one(batch: list[str], timed: bool) -> None:
            nonlocal tokens, retried
            started = time.perf_counter()
            for attempt in range(TRANSPORT_TRIES):
                try:
                    response = await client.post(
                        "/v1/embeddings", json={"model": EMBED, "input": batch}
                    )
                    break
                except httpx.TransportError:  # a kept-alive connection the server dropped
                    if attempt == TRANSPORT_TRIES - 1:
                        raise
                    retried += 1
            response.raise_for_status()
            reply = response.json()
            assert len(reply["data"]) == len(batch)
            if timed:
                latencies.append(time.perf_counter() - started)
                tokens += reply["usage"]["prompt_tokens"]

        async def worker(queue: list[list[str]], timed: bool) -> None:
            while queue:
                await one(queue.pop(), timed)

        warm = batches[:WARMUP]
        await asyncio.gather(*(worker(warm, False) for _ in range(min(concurrency, WARMUP))))
        queue = batches[WARMUP:]
        started = time.perf_counter()
        await asyncio.gather(*(worker(queue, True) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "embeddings_per_s": requests * inputs / elapsed,
        "tokens_per_s": tokens / elapsed,
        "latency": percentiles(latencies),
        "retried": retried,
    }


def table(runs: dict[str, dict[int, list[dict]]], inputs: int) -> str:
    """Medians over rounds, the service against bare vLLM."""
    lines = [
        f"Inputs per request: {inputs}. Medians of the rounds.",
        "",
        "| Concurrency | Server | Embeddings/s | Input tok/s | p50 ms | p99 ms | vs bare |",
        "|---|---|---|---|---|---|---|",
    ]
    for concurrency in sorted(next(iter(runs.values()))):
        bare = statistics.median(r["embeddings_per_s"] for r in runs["bare vLLM"][concurrency])
        for name, by_concurrency in runs.items():
            rounds = by_concurrency[concurrency]
            rate = statistics.median(r["embeddings_per_s"] for r in rounds)
            lines.append(
                f"| {concurrency} | {name} | {rate:.1f} "
                f"| {statistics.median(r['tokens_per_s'] for r in rounds):.0f} "
                f"| {statistics.median(r['latency']['p50_ms'] for r in rounds):.1f} "
                f"| {statistics.median(r['latency']['p99_ms'] for r in rounds):.1f} "
                f"| {rate / bare:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    stop_servers_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inputs", type=int, default=1, help="texts per request")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="times the default number of requests"
    )
    parser.add_argument(
        "--model",
        default="tiny",
        metavar="tiny|embed-small|PATH",
        help="tiny: the local profile's embedding model; embed-small: a generated one of a small "
        "real embedding model's size (26M parameters); or a model's folder",
    )
    parser.add_argument(
        "--ray-llm",
        action="store_true",
        help="also measure Ray Serve LLM (default and direct streaming) on the same model",
    )
    args = parser.parse_args()
    config = ModelTypeConfig.model_validate(embed_type())
    model = embedding_model(args.model, config)
    engine_args = {
        k: v for k, v in engine_kwargs(config, model).items() if k not in ENGINE_SET_BY_NAME
    }
    log_dir = Path(tempfile.mkdtemp(prefix="sai-embed-"))
    contenders: dict[str, Callable[[], AbstractContextManager[Server]]] = {
        "bare vLLM": partial(bare_vllm, model, engine_args, log_dir),
        "ServiceAi": partial(serviceai, log_dir, model),
    }
    if args.ray_llm:
        for direct in RAY_LLM_MODES.values():
            label = "Ray Serve LLM direct" if direct else "Ray Serve LLM"
            contenders[label] = partial(ray_llm, model, engine_args, log_dir, direct)
    with open(STACK_LOCK, "w") as lock:
        print(f"waiting for {STACK_LOCK} (held while tests or a benchmark run) ...", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = measure(contenders, args.rounds, args.inputs, args.scale)
    report = table(runs, args.inputs)
    print(report)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    suffix = "" if args.model == "tiny" else f"-{Path(args.model).name}"
    out = RESULTS / f"{stamp}-embeddings{suffix}.json"
    result = {"model": args.model, "inputs": args.inputs, "runs": runs, "table": report}
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out.relative_to(PROJECT_ROOT)} (logs in {log_dir})")


def embedding_model(name: str, config: ModelTypeConfig) -> str:
    """The folder (or id) of the model `--model` names; a generated one is made here once."""
    if name == "tiny":
        return str(generated_model(config.resolved_model()) or config.model)
    if name == "embed-small":
        path = PROJECT_ROOT / "models" / "embed-small"
        if not (path / tiny_model.MARKER).exists():
            tiny_model.generate(path, dims=tiny_model.EMBED_SMALL)
        return str(path)
    local = Path(name).expanduser()
    return str(local.resolve()) if local.exists() else name


def measure(
    contenders: dict[str, Callable[[], AbstractContextManager[Server]]],
    rounds: int,
    inputs: int,
    scale: float,
) -> dict[str, dict[int, list[dict]]]:
    """Every round's results, by server and concurrency; each round starts one server later."""
    runs: dict[str, dict[int, list[dict]]] = {name: {} for name in contenders}
    names = list(contenders)
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            with contenders[name]() as server:
                for concurrency in CONCURRENCIES:
                    requests = max(concurrency, int(REQUESTS[concurrency] * scale))
                    result = asyncio.run(load(server, concurrency, requests, inputs, round_))
                    runs[name].setdefault(concurrency, []).append(result)
                    print(f"round {round_} {name} c={concurrency}: {result}", flush=True)
    return runs


if __name__ == "__main__":
    main()
