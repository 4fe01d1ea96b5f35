"""Multi-turn chat across replicas: what prefix-cache affinity is worth (`make bench-affinity`).

64 conversations of 6 turns, each with its own ~1k-token system prompt and a growing history
(every turn resends the whole conversation, as OpenAI clients do), 8 conversations at a time,
on the tiny model with the local profile's engine arguments. One run measures, side by side:
ServiceAi-Fast at one replica (the reference: all of a conversation is on one cache), then at
2 and 4 replicas with the power of two choices (`prefix_affinity: false`), with this service's
router (deployments.request_router), and Ray Serve LLM with its `PrefixCacheAffinityRouter`.
Per setup: the share of turns 2+'s prompt tokens served from cache
(`usage.prompt_tokens_details.cached_tokens`), their TTFT p50/p99, and the throughput.
Results: bench/results/<stamp>-affinity.json and a table on stdout (bench/NOTES.md).

`--shared-system` gives every conversation the same system prompt (one hot prefix, as an agent
framework's instructions are): what the load bound `max_imbalance` is for. `--max-imbalance
2,8` measures the router once per bound; `--without-ray-llm` leaves Ray Serve LLM out;
`--ingress-replicas 2` runs this service's ingress as production does, on more than one replica
(each with its own router).

By default a conversation sends its next turn the moment its reply ends (a closed loop): with
the power of two, the replica it just left is then the one with a free slot, so it mostly
returns there, and the power of two looks sticky in a way real traffic is not. `--think-s 1`
makes each user pause between turns (exponential, mean 1 s, seeded) and `--open 16` keeps more
conversations open at once, so that other conversations' turns come in between, as people's
do (bench/NOTES.md, "The closed loop flatters the power of two").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.report import gpu_names
from bench.run import RESULTS, engine_args_arg
from bench.servers import (
    BENCH_TYPE,
    PROJECT_ROOT,
    BenchTarget,
    Server,
    bench_model_type,
    bench_target,
    free_port,
    ray_serve_llm,
    serviceai,
    stop_servers_on_sigterm,
)
from deployments import tiny_model
from deployments.request_router import MAX_IMBALANCE

CONVERSATIONS = 64
TURNS = 6
IN_FLIGHT = 8
SYSTEM_WORDS = 175  # the tiny model's tokenizer: ~5.7 tokens a word, about 1,000 tokens
USER_WORDS = 10  # ~57 tokens: six turns and replies stay within the 2,048-token context
MAX_TOKENS = 24
RAY_ROUTER = "ray.serve.llm.request_router.PrefixCacheAffinityRouter"
SINGLE = "ServiceAi, 1 replica"  # the reference: every conversation's prefix in one cache


@dataclass
class Turn:
    turn: int
    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def words(rng: random.Random, count: int) -> str:
    return " ".join(
        f"{rng.choice('bcdfghjklmnpqrstvwxz')}{rng.randrange(10_000)}" for _ in range(count)
    )


async def one_turn(
    client: httpx.AsyncClient, server: Server, messages: list[dict]
) -> tuple[Turn, str]:
    body = {
        "model": server.model,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = None
    text: list[str] = []
    usage = None
    async with client.stream(
        "POST",
        f"{server.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {server.api_key}"},
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread())[:500]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                if first is None:
                    first = time.perf_counter()
                text.append(chunk["choices"][0]["delta"].get("content") or "")
            if chunk.get("usage"):
                usage = chunk["usage"]
    done = time.perf_counter()
    details = usage.get("prompt_tokens_details") or {}
    turn = Turn(
        0,
        (first or done) - started,
        done - started,
        usage["prompt_tokens"],
        details.get("cached_tokens") or 0,
        usage["completion_tokens"],
    )
    return turn, "".join(text)


async def conversation(
    client: httpx.AsyncClient, server: Server, seed: int, shared_system: bool, think_s: float = 0
) -> list[Turn]:
    rng = random.Random(seed)
    pause = random.Random(f"think {seed}")  # its own stream: the texts stay those of think_s 0
    system = words(random.Random(-2) if shared_system else rng, SYSTEM_WORDS)
    messages = [{"role": "system", "content": system}]
    turns = []
    for number in range(TURNS):
        messages.append({"role": "user", "content": words(rng, USER_WORDS)})
        turn, reply = await one_turn(client, server, messages)
        turn.turn = number
        turns.append(turn)
        messages.append({"role": "assistant", "content": reply})
        if think_s and number < TURNS - 1:
            await asyncio.sleep(pause.expovariate(1 / think_s))
    return turns


async def workload(
    server: Server, shared_system: bool, think_s: float = 0, open_conversations: int = IN_FLIGHT
) -> dict[str, float]:
    gate = asyncio.Semaphore(open_conversations)
    async with httpx.AsyncClient(timeout=600) as client:
        # One conversation first, to warm what every server compiles on its first request.
        await conversation(client, server, -1, shared_system)

        async def gated(seed: int) -> list[Turn]:
            async with gate:
                return await conversation(client, server, seed, shared_system, think_s)

        started = time.perf_counter()
        results = await asyncio.gather(*(gated(seed) for seed in range(CONVERSATIONS)))
        wall = time.perf_counter() - started
    turns = [t for conversation_turns in results for t in conversation_turns]
    later = [t for t in turns if t.turn > 0]
    ttfts = sorted(t.ttft_s for t in later)
    return {
        "cached_share": sum(t.cached_tokens for t in later) / sum(t.prompt_tokens for t in later),
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
        "requests_per_s": len(turns) / wall,
        "output_tokens_per_s": sum(t.completion_tokens for t in turns) / wall,
        "prompt_tokens_mean": statistics.mean(t.prompt_tokens for t in later),
        "wall_s": wall,
    }


def setups(
    target: BenchTarget,
    log_dir: Path,
    replicas: list[int],
    bounds: list[int],
    with_ray: bool,
    ingress_replicas: int = 1,
) -> list[tuple[str, Callable[[], AbstractContextManager[Server]]]]:
    def ours(
        count: int, affinity: bool, bound: int = bounds[0]
    ) -> Callable[[], AbstractContextManager[Server]]:
        settings = {
            "num_replicas": count,
            "num_cpus": 0.25,
            "prefix_affinity": affinity,
            "max_imbalance": bound,
        }
        if target.gpu:  # the replicas share the node's one GPU, each with its engine_args' memory
            settings["num_gpus_per_shard"] = 1 / count
        name = f"serviceai-{count}-{f'affinity-{bound}' if affinity else 'pow2'}.log"
        return lambda: serviceai(
            target, free_port(), log_dir, {}, settings, name, ingress_replicas=ingress_replicas
        )

    def rays(count: int) -> Callable[[], AbstractContextManager[Server]]:
        return lambda: ray_serve_llm(
            target, free_port(), log_dir, direct=False, replicas=count, request_router=RAY_ROUTER
        )

    # The one-replica reference runs last: a run cut short (a device call's budget) keeps the
    # comparison the TTFT goal is judged on; the table shows the reference first all the same.
    plan = []
    for count in replicas:
        plan.append((f"ServiceAi, {count} replicas, power of two", ours(count, False)))
        plan += [
            (
                f"ServiceAi, {count} replicas, prefix affinity"
                + (f", max_imbalance {bound}" if len(bounds) > 1 else ""),
                ours(count, True, bound),
            )
            for bound in bounds
        ]
        if with_ray:
            plan.append(
                (f"Ray Serve LLM, {count} replicas, PrefixCacheAffinityRouter", rays(count))
            )
    return plan + [(SINGLE, ours(1, True))]


def table(results: dict[str, dict[str, float]]) -> str:
    lines = [
        "| setup | cached share, turns 2+ | TTFT p50 / p99, turns 2+ (ms) | requests/s | output tok/s |",
        "|---|---|---|---|---|",
    ]
    for name, r in sorted(results.items(), key=lambda item: item[0] != SINGLE):
        lines.append(
            f"| {name} | {100 * r['cached_share']:.0f}% | {r['ttft_p50_ms']:.0f} / "
            f"{r['ttft_p99_ms']:.0f} | {r['requests_per_s']:.2f} | {r['output_tokens_per_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    stop_servers_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="2,4", help="replica counts, comma-separated")
    parser.add_argument(
        "--model",
        default="tiny",
        metavar="tiny|prefill-heavy|PATH",
        help="prefill-heavy: a generated 3M-parameter model whose prefill is a good part of a "
        "TTFT on two cores, as a real model's is on a GPU (the tiny model's costs nothing); "
        "a path: that model with vLLM's defaults and --engine-args (on a GPU node, the "
        "replicas share its one GPU: give each its memory, bench/gpu/README.md)",
    )
    parser.add_argument(
        "--engine-args",
        type=engine_args_arg,
        default={},
        metavar="JSON",
        help="engine args on top, identical for every server",
    )
    parser.add_argument(
        "--shared-system",
        action="store_true",
        help="one system prompt for every conversation (a hot prefix)",
    )
    parser.add_argument(
        "--max-imbalance",
        default=str(MAX_IMBALANCE),
        help="the router's load bounds to measure, comma-separated",
    )
    parser.add_argument("--without-ray-llm", action="store_true", help="leave Ray Serve LLM out")
    parser.add_argument(
        "--ingress-replicas",
        type=int,
        default=1,
        help="this service's ingress replicas (production runs at least 2)",
    )
    parser.add_argument(
        "--think-s",
        type=float,
        default=0,
        help="each user's mean pause between turns (0: the next turn at once)",
    )
    parser.add_argument("--open", type=int, default=IN_FLIGHT, help="conversations open at once")
    args = parser.parse_args()
    gpu = bool(gpu_names())
    if args.model == "tiny":
        target = bench_target(None, args.engine_args, [args.open], gpu)
    elif args.model == "prefill-heavy":
        path = PROJECT_ROOT / "models" / "prefill-heavy"
        if not (path / tiny_model.MARKER).exists():
            tiny_model.generate(path, dims=tiny_model.PREFILL_HEAVY)
        target = bench_target(
            str(path), {**bench_model_type()["engine_args"], **args.engine_args}, [args.open], gpu
        )
    else:
        target = bench_target(args.model, args.engine_args, [args.open], gpu)
    log_dir = Path(tempfile.mkdtemp(prefix="sai-affinity-"))
    results: dict[str, dict[str, float]] = {}
    plan = setups(
        target,
        log_dir,
        [int(n) for n in args.replicas.split(",")],
        [int(n) for n in args.max_imbalance.split(",")],
        not args.without_ray_llm,
        args.ingress_replicas,
    )
    for name, start in plan:
        print(f"{name} ...", flush=True)
        with start() as server:
            results[name] = asyncio.run(
                workload(server, args.shared_system, args.think_s, args.open)
            )
        print(f"  {results[name]}", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {
        "workload": {
            "conversations": CONVERSATIONS,
            "turns": TURNS,
            "in_flight": args.open,
            "think_s": args.think_s,
            "system_words": SYSTEM_WORDS,
            "max_tokens": MAX_TOKENS,
            "model_type": BENCH_TYPE,
            "model": args.model,
            "engine_args": target.engine_args,
            "gpu": gpu_names(),
            "shared_system": args.shared_system,
            "ingress_replicas": args.ingress_replicas,
        },
        "results": results,
        "logs": str(log_dir),
    }
    (RESULTS / f"{stamp}-affinity-{Path(args.model).name}.json").write_text(
        json.dumps(summary, indent=2)
    )
    print(table(results))


if __name__ == "__main__":
    main()
