"""LoRA adapters through the service against bare vLLM with the same adapters (`make bench-adapters`).

One run, the two servers in turn, each alone on the machine: bare `vllm serve --enable-lora
--lora-modules ...` and this service's ServiceAi-Fast with the same adapters in its config
(`serve run` of the local profile with that type alone, a plan that never refuses), on the tiny
model with the local profile's engine arguments and the same LoRA sizes (`max_loras`,
`max_lora_rank`). Sixteen random rank-8 adapters (written by `peft`) are registered on both; at
concurrency 8, clients send chat requests of 64 generated tokens (`ignore_eos`) spread evenly
over the base model alone, then 1, 4 and 16 adapters: output tokens per second per spread, in
`--rounds` rounds that alternate which server goes first.
Results: bench/results/<stamp>-adapters.json and a table on stdout (bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import statistics
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx

from bench.run import RESULTS, STACK_LOCK
from bench.servers import (
    BENCH_LIMITS,
    BENCH_TYPE,
    PROJECT_ROOT,
    Server,
    bench_model_type,
    engine_cli_args,
    free_port,
    local_service,
    stop_servers_on_sigterm,
    vllm_command,
    vllm_server,
)
from deployments.deployment_options import engine_kwargs
from deployments.model_type import ModelTypeConfig, tiny_model_dir
from deployments.tiny_model import ensure

ADAPTERS = 16
SPREADS = (0, 1, 4, 16)
"""Adapters the requests are spread over; 0: the base model alone."""
LORA_ARGS = {"max_loras": 4, "max_lora_rank": 8}
CONCURRENCY = 8
REQUESTS = 256
TOKENS = 64
ENGINE_SET_BY_NAME = {"model", "tokenizer", "served_model_name", "enable_lora"}
"""Given to `vllm serve` as flags of their own (bare_vllm), not as engine args."""


def write_adapters(folder: Path, count: int) -> dict[str, str]:
    """`count` random rank-8 adapters of the tiny model's attention: path by adapter name."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = {}
    for index in range(count):
        out = folder / f"a{index}"
        torch.manual_seed(index)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
        config = LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        )
        get_peft_model(base, config).save_pretrained(out)
        paths[f"a{index}"] = str(out)
    return paths


def model_type(adapters: dict[str, str]) -> dict[str, Any]:
    """ServiceAi-Fast as the local profile has it, with the adapters and the LoRA sizes."""
    fast = bench_model_type()
    return {
        **fast,
        "model_env": None,
        "adapters": [{"name": name, "path": path} for name, path in adapters.items()],
        "engine_args": {**fast.get("engine_args", {}), **LORA_ARGS},
    }


def bare_vllm(config: ModelTypeConfig, log_dir: Path) -> AbstractContextManager[Server]:
    """`vllm serve` of the tiny model with the type's adapters under the service's names."""
    model = str(ensure(tiny_model_dir()))
    kwargs = engine_kwargs(config, model)
    port = free_port()
    modules = [f"{name}={path}" for name, path in config.adapter_paths().items()]
    flags = [
        "--enable-lora",
        "--lora-modules",
        *modules,
        *engine_cli_args({k: v for k, v in kwargs.items() if k not in ENGINE_SET_BY_NAME}),
    ]
    return vllm_server(
        vllm_command(model, BENCH_TYPE, port, flags), port, log_dir / "bare-lora.log"
    )


def serviceai(entry: dict[str, Any], log_dir: Path) -> AbstractContextManager[Server]:
    """The service as `make run` starts it, with the adapted type alone."""
    return local_service(entry, BENCH_LIMITS, log_dir / "serviceai-lora.log")


def models_of(spread: int, names: list[str]) -> list[str]:
    """The model names requests go to: the base, or `spread` adapters (`Type:adapter`, as
    both servers name them)."""
    return [f"{BENCH_TYPE}:{n}" for n in names[:spread]] or [BENCH_TYPE]


async def load(server: Server, models: list[str]) -> dict[str, float]:
    """REQUESTS chat requests of TOKENS tokens, CONCURRENCY at a time, over `models` in turn."""
    headers = {"Authorization": f"Bearer {server.api_key}"}
    queue = [models[i % len(models)] for i in range(REQUESTS)]
    tokens = 0
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=300) as client:

        async def worker() -> None:
            nonlocal tokens
            while queue:
                body = {
                    "model": queue.pop(),
                    "messages": [{"role": "user", "content": f"tell me {len(queue)}"}],
                    "max_tokens": TOKENS,
                    "ignore_eos": True,
                }
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                tokens += response.json()["usage"]["completion_tokens"]

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        elapsed = time.perf_counter() - started
    return {"output_tok_s": tokens / elapsed, "elapsed_s": elapsed}


def table(runs: dict[str, dict[int, list[dict]]]) -> str:
    lines = [
        f"Chat, {TOKENS} tokens a reply, concurrency {CONCURRENCY}, {ADAPTERS} adapters "
        f"registered ({LORA_ARGS}). Output tok/s, medians of the rounds.",
        "",
        "| Adapters in use | bare vLLM | ServiceAi | ratio |",
        "|---|---:|---:|---:|",
    ]
    for spread in SPREADS:
        bare = statistics.median(r["output_tok_s"] for r in runs["bare vLLM"][spread])
        ours = statistics.median(r["output_tok_s"] for r in runs["ServiceAi"][spread])
        label = "none (base model)" if spread == 0 else str(spread)
        lines.append(f"| {label} | {bare:.0f} | {ours:.0f} | {ours / bare:.2f} |")
    return "\n".join(lines)


def main() -> None:
    stop_servers_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="sai-lora-"))
    adapters = write_adapters(log_dir / "adapters", ADAPTERS)
    entry = model_type(adapters)
    config = ModelTypeConfig.model_validate(entry)
    names = list(adapters)
    runs: dict[str, dict[int, list[dict]]] = {"bare vLLM": {}, "ServiceAi": {}}
    with open(STACK_LOCK, "w") as lock:
        print(f"waiting for {STACK_LOCK} (held while tests or a benchmark run) ...", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        for round_ in range(args.rounds):
            order = ("bare vLLM", "ServiceAi") if round_ % 2 == 0 else ("ServiceAi", "bare vLLM")
            for name in order:
                starting = bare_vllm(config, log_dir) if name == "bare vLLM" else None
                with starting or serviceai(entry, log_dir) as server:
                    for spread in SPREADS:
                        result = asyncio.run(load(server, models_of(spread, names)))
                        runs[name].setdefault(spread, []).append(result)
                        print(f"round {round_} {name} adapters={spread}: {result}", flush=True)
    report = table(runs)
    print(report)
    out = RESULTS / f"{time.strftime('%Y%m%d-%H%M%S')}-adapters.json"
    out.write_text(json.dumps({"runs": runs, "table": report}, indent=1))
    print(f"wrote {out.relative_to(PROJECT_ROOT)} (logs in {log_dir})")


if __name__ == "__main__":
    main()
