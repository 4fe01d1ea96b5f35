"""Plans under overload: a free flood and a pro trickle (`make bench-priority`).

ServiceAi-Fast on the tiny model with 8 engine slots (`max_num_seqs`), as the issue measured
bare vLLM. A pro request of 30 tokens every half second, alone, ten times in all (its unloaded
TTFT; `--alone-requests`), and under a flood: 24 free streams of 300 tokens kept in flight
(each one that ends is replaced, from a process of their own), 20 times in all
(`--pro-requests`). The flood is the only difference between the two: a request sent after
half a second of quiet takes some 2 ms longer than one sent right after another, on bare vLLM
as on the service (bench/NOTES.md, "The unloaded figure"). The two take turns, alone phases on
either side of each flood phase (`--rounds` flood phases, two by default), so that the
machine's drift does not move the ratio. TTFT p50/p99 per plan, side by side in one run:
- fcfs: vLLM's default; Serve holds what the 8 slots cannot take, first come first served;
- priority, no reserve: `scheduling_policy: priority`, requests wait in the replica in plan
  order (deployments.priority_gate) but every slot is anyone's;
- priority: the same, 1, 2 or 4 of the 8 slots kept for the first plan (the service's design;
  `reserved_slots`, default an eighth), a free stream that starts while the free requests fill
  their slots sent 8 (the default `busy_stream_interval`), 16, 4 or 1 tokens a chunk, and
  once with the engine's worker in a process of its own (vLLM's layout on a CPU build);
- bare vLLM: `vllm serve` as it comes with `--scheduling-policy priority`, the plans'
  priorities in each request's `priority`, and 7 free streams, so that one slot is always free
  as the reserve keeps it: the engine's own floor, what a pro request waits beside 7 free
  decodes with no gateway.
Results: bench/results/<stamp>-priority.json (every pro TTFT too, under `pro_ms`) and a table
on stdout (bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench.report import gpu_names
from bench.run import RESULTS, engine_args_arg
from bench.servers import (
    BENCH_LIMITS,
    BENCH_TYPE,
    Server,
    bare_vllm,
    bench_target,
    free_port,
    provision_key,
    serviceai,
    stop_servers_on_sigterm,
)

SLOTS = 8
FLOOD = 24
FLOOD_TOKENS = 300
PRO_TOKENS = 30
PRO_REQUESTS = 20
PRO_EVERY_S = 0.5
UNLOADED = 10
RESAMPLES = 2000
ROUNDS = 2
BARE = "bare vLLM, 7 free streams (a slot always free), no gateway"
PLANS = {
    "free": {"priority": 10, BENCH_TYPE: BENCH_LIMITS},
    "pro": {"priority": 0, BENCH_TYPE: BENCH_LIMITS},
}
ENGINE_KEYS = ("scheduling_policy",)
PRIORITY = {"max_ongoing_requests": 4 * SLOTS, "scheduling_policy": "priority"}
SETUPS: dict[str, dict[str, Any]] = {
    "fcfs": {"max_ongoing_requests": SLOTS},
    "priority, no reserve": {**PRIORITY, "reserved_slots": 0},
    "priority, 1 slot kept for pro, free streams 8 tokens a chunk when busy (the defaults)": {
        **PRIORITY,
        "reserved_slots": 1,
    },
    "priority, 1 slot kept for pro, free streams 16 tokens a chunk when busy": {
        **PRIORITY,
        "reserved_slots": 1,
        "busy_stream_interval": 16,
    },
    "priority, 1 slot kept for pro, free streams 4 tokens a chunk when busy": {
        **PRIORITY,
        "reserved_slots": 1,
        "busy_stream_interval": 4,
    },
    "priority, 1 slot kept for pro, free streams token by token": {
        **PRIORITY,
        "reserved_slots": 1,
        "busy_stream_interval": 1,
    },
    "priority, 2 slots kept for pro": {**PRIORITY, "reserved_slots": 2},
    "priority, 4 slots kept for pro": {**PRIORITY, "reserved_slots": 4},
    # vLLM's own CPU layout, which the service trades for throughput (docs/deploy.md)
    "priority, 1 slot kept for pro, the engine's worker in a process of its own": {
        **PRIORITY,
        "reserved_slots": 1,
        "env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    },
    BARE: {"scheduling_policy": "priority"},
}


async def ttft(
    client: httpx.AsyncClient,
    server: Server,
    key: str,
    tokens: int,
    text: str,
    stream: bool = True,
    priority: int | None = None,
) -> float:
    """Until the first token's chunk (a whole reply's time where `stream` is off). `priority`:
    vLLM's own field, for bare vLLM (the service takes it from the caller's plan)."""
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "stream": stream,
        "ignore_eos": True,
    }
    if priority is not None:
        body["priority"] = priority
    started = time.perf_counter()
    first = None
    async with client.stream(
        "POST",
        f"{server.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and '"choices":[{' in line:
                first = time.perf_counter()
    return (first or time.perf_counter()) - started


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "count": len(ordered),
    }


def ratio_interval(
    alone: list[float], loaded: list[float], share: float = 0.9, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap interval (`share` of the resamples) of the ratio of the loaded median to the
    alone one: on two medians of a few dozen requests each, the ratio alone says little (a
    few milliseconds either side move it by tenths)."""
    pick = random.Random(seed)
    ratios = sorted(
        statistics.median(pick.choices(loaded, k=len(loaded)))
        / statistics.median(pick.choices(alone, k=len(alone)))
        for _ in range(RESAMPLES)
    )
    cut = int((1 - share) / 2 * RESAMPLES)
    return ratios[cut], ratios[RESAMPLES - 1 - cut]


async def flood(
    base_url: str,
    model: str,
    key: str,
    stream: bool,
    tokens: int,
    streams: int,
    priority: int | None,
    stop: Any,
    started: Any,
) -> dict[str, Any]:
    """`streams` free requests kept in flight until `stop` is set; their TTFTs and end times."""
    server = Server("flood", base_url, key, model)
    ttfts: list[float] = []
    done: list[float] = []
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=100)) as client:

        async def free_stream(number: int) -> None:
            while not stop.is_set():
                ttfts.append(
                    await ttft(client, server, key, tokens, f"flood {number}", stream, priority)
                )
                done.append(time.perf_counter())  # CLOCK_MONOTONIC: the same in every process

        running = [asyncio.ensure_future(free_stream(n)) for n in range(streams)]
        started.set()
        await asyncio.gather(*running)
    return {"ttfts": ttfts, "done": done}


def flood_process(
    base_url: str,
    model: str,
    key: str,
    stream: bool,
    tokens: int,
    streams: int,
    priority: int | None,
    stop: Any,
    started: Any,
    out: Any,
) -> None:
    out.put(
        asyncio.run(flood(base_url, model, key, stream, tokens, streams, priority, stop, started))
    )


def split(total: int, parts: int) -> list[int]:
    """`total` requests over `parts` phases, as evenly as they go (the first phases take the
    remainder)."""
    return [total // parts + (n < total % parts) for n in range(parts)]


async def alone_phase(
    client: httpx.AsyncClient,
    server: Server,
    pro_key: str,
    pro_priority: int | None,
    requests: int,
    first: int,
) -> list[float]:
    """The pro trickle as the flood phase sends it, without the flood."""
    alone = []
    for n in range(requests):
        alone.append(
            await ttft(
                client, server, pro_key, PRO_TOKENS, f"alone {first + n}", priority=pro_priority
            )
        )
        await asyncio.sleep(PRO_EVERY_S)
    return alone


async def flood_phase(
    client: httpx.AsyncClient,
    server: Server,
    pro_key: str,
    pro_priority: int | None,
    flood: dict[str, Any],
    requests: int,
    first: int,
) -> dict[str, Any]:
    """The flood started, the pro trickle timed, the flood stopped and drained. Free tokens
    count the free requests that ended inside the pro requests' window, not those that end
    while the flood drains after it."""
    spawn = multiprocessing.get_context("spawn")
    stop, started, out = spawn.Event(), spawn.Event(), spawn.Queue()
    flooding = spawn.Process(
        target=flood_process,
        args=(
            server.base_url,
            server.model,
            server.api_key,
            flood["stream"],
            flood["tokens"],
            flood["streams"],
            flood["priority"],
            stop,
            started,
            out,
        ),
    )
    flooding.start()
    await asyncio.to_thread(started.wait, 60)
    await asyncio.sleep(3)  # the flood fills the slots and the queue
    window_start = time.perf_counter()
    pro = []
    for n in range(requests):
        pro.append(
            await ttft(
                client, server, pro_key, PRO_TOKENS, f"pro {first + n}", priority=pro_priority
            )
        )
        await asyncio.sleep(PRO_EVERY_S)
    window_end = time.perf_counter()
    stop.set()
    free = await asyncio.to_thread(out.get, True, 600)
    flooding.join()
    ended = sum(1 for done in free["done"] if window_start <= done <= window_end)
    return {
        "pro": pro,
        "free_ttfts": free["ttfts"],
        "free_tokens": ended * flood["tokens"],
        "window_s": window_end - window_start,
    }


async def workload(
    server: Server,
    pro_key: str,
    stream_flood: bool,
    flood_tokens: int = FLOOD_TOKENS,
    pro_requests: int = PRO_REQUESTS,
    alone_requests: int = UNLOADED,
    rounds: int = ROUNDS,
    bare: bool = False,
) -> dict[str, Any]:
    """Alone and flood phases in turn, an alone phase on either side of each flood phase
    (alone, flood, alone, ... flood, alone): the machine's speed drifts within minutes (the same
    code has timed a pro request alone at 23 and at 29 ms), and a flood phase between two alone
    ones takes no steady drift into the ratio, as one alone phase before them all did.

    The pro requests are timed from this process; the flood runs in another, so that the
    pro TTFTs do not include this event loop's turns parsing the flood's streams (on a
    production service they come from other clients). `bare`: vLLM's own server, which takes
    each request's priority from the request and has no reserve: SLOTS - 1 free streams."""
    pro_priority = PLANS["pro"]["priority"] if bare else None
    flood = {
        "stream": stream_flood,
        "tokens": flood_tokens,
        "streams": SLOTS - 1 if bare else FLOOD,
        "priority": PLANS["free"]["priority"] if bare else None,
    }
    alone_counts, pro_counts = split(alone_requests, rounds + 1), split(pro_requests, rounds)
    unloaded: list[float] = []
    pro: list[float] = []
    free_ttfts: list[float] = []
    free_tokens, window, phases = 0, 0.0, []
    async with httpx.AsyncClient(timeout=600) as client:
        await ttft(client, server, pro_key, PRO_TOKENS, "warm up", priority=pro_priority)
        for n in range(rounds + 1):
            alone = await alone_phase(
                client, server, pro_key, pro_priority, alone_counts[n], len(unloaded)
            )
            unloaded += alone
            phases.append({"phase": "alone", **percentiles(alone)})
            if n == rounds:
                break
            flooded = await flood_phase(
                client, server, pro_key, pro_priority, flood, pro_counts[n], len(pro)
            )
            pro += flooded["pro"]
            free_ttfts += flooded["free_ttfts"]
            free_tokens += flooded["free_tokens"]
            window += flooded["window_s"]
            phases.append(
                {
                    "phase": "flood",
                    **percentiles(flooded["pro"]),
                    "free_tokens_per_s": flooded["free_tokens"] / flooded["window_s"],
                }
            )
    return {
        "pro_unloaded": percentiles(unloaded),
        "pro_under_flood": percentiles(pro),
        "free_under_flood": percentiles(free_ttfts),
        "free_tokens_per_s_while_pro_ran": free_tokens / window,
        "free_streams": flood["streams"],
        "phases": phases,
        "pro_ms": {
            "alone": [round(1000 * t, 2) for t in unloaded],
            "under_flood": [round(1000 * t, 2) for t in pro],
        },
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| setup | pro TTFT alone p50 (ms; each alone phase) | pro under flood p50 / p99 (ms) | "
        "pro p50 / alone (90% interval) | "
        "free under flood p50 / p99 (ms) | free output tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        alone, pro, free = r["pro_unloaded"], r["pro_under_flood"], r["free_under_flood"]
        low, high = ratio_interval(r["pro_ms"]["alone"], r["pro_ms"]["under_flood"])
        each = " / ".join(
            f"{phase['p50_ms']:.0f}" for phase in r["phases"] if phase["phase"] == "alone"
        )
        lines.append(
            f"| {name} | {alone['p50_ms']:.0f} ({each}) | "
            f"{pro['p50_ms']:.0f} / {pro['p99_ms']:.0f} | "
            f"{pro['p50_ms'] / alone['p50_ms']:.2f}x ({low:.2f}-{high:.2f}) | "
            f"{free['p50_ms']:.0f} / {free['p99_ms']:.0f} | "
            f"{r['free_tokens_per_s_while_pro_ran']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    stop_servers_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--unary-flood",
        action="store_true",
        help="the flood asks for whole replies: the engine's work without the "
        "streaming of its tokens (a free TTFT is then a whole reply's time)",
    )
    parser.add_argument(
        "--setup",
        action="append",
        default=[],
        help="only the setups whose names start with this (repeatable; run in the order given)",
    )
    parser.add_argument(
        "--flood-tokens",
        type=int,
        default=FLOOD_TOKENS,
        help="tokens of each free request (a GPU's eager decode step is slower "
        "than the tiny model's on a CPU: fewer keep a run short)",
    )
    parser.add_argument("--pro-requests", type=int, default=PRO_REQUESTS)
    parser.add_argument(
        "--alone-requests",
        type=int,
        default=UNLOADED,
        help="pro requests timed alone (its unloaded TTFT), over the alone phases",
    )
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help="flood phases, each between two alone phases"
    )
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="this model with vLLM's defaults and --engine-args instead of the "
        "tiny one with the local profile's (on a GPU node: bench/gpu/README.md)",
    )
    parser.add_argument(
        "--engine-args",
        type=engine_args_arg,
        default={},
        metavar="JSON",
        help="engine args on top, e.g. a GPU's memory share",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.pro_requests < args.rounds or args.alone_requests <= args.rounds:
        parser.error(
            "each flood phase needs a pro request and each of the --rounds + 1 alone phases one"
        )
    # in the order asked for: a run cut short (a device call's budget) loses the last ones
    chosen = {
        name: SETUPS[name]
        for prefix in args.setup or [""]
        for name in SETUPS
        if name.startswith(prefix)
    }
    target = bench_target(args.model, args.engine_args, [FLOOD], bool(gpu_names()))
    log_dir = Path(tempfile.mkdtemp(prefix="sai-priority-"))
    results: dict[str, dict[str, Any]] = {}
    for name, setup in chosen.items():
        settings = {key: value for key, value in setup.items() if key not in ENGINE_KEYS}
        engine_args = {**target.engine_args, "max_num_seqs": SLOTS}
        engine_args.update({key: value for key, value in setup.items() if key in ENGINE_KEYS})
        settings["engine_args"] = engine_args
        print(f"{name} ...", flush=True)
        phases = {
            "stream_flood": not args.unary_flood,
            "flood_tokens": args.flood_tokens,
            "pro_requests": args.pro_requests,
            "alone_requests": args.alone_requests,
            "rounds": args.rounds,
        }
        if name == BARE:
            bare = replace(target, engine_args=engine_args)
            with bare_vllm(bare, free_port(), log_dir) as server:
                results[name] = asyncio.run(workload(server, server.api_key, bare=True, **phases))
        else:
            log_name = f"serviceai-{name.split(',')[0].replace(' ', '-')}-{len(results)}.log"
            with serviceai(target, free_port(), log_dir, {}, settings, log_name, PLANS) as server:
                pro_key = provision_key(
                    f"sqlite+aiosqlite:///{server.ray_dir / 'keys.db'}",
                    "pro@serviceai.local",
                    "pro",
                )
                results[name] = asyncio.run(workload(server, pro_key, **phases))
        print(f"  {results[name]}", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {
        # Free streams per setup are in each result: the bare setup floods with fewer.
        "workload": {
            "slots": SLOTS,
            "flood_tokens": args.flood_tokens,
            "pro_tokens": PRO_TOKENS,
            "pro_requests": args.pro_requests,
            "alone_requests": args.alone_requests,
            "rounds": args.rounds,
            "flood_streams": not args.unary_flood,
            "model": args.model or "tiny",
            "engine_args": target.engine_args,
            "gpu": gpu_names(),
        },
        "results": results,
        "logs": str(log_dir),
    }
    (RESULTS / f"{stamp}-priority.json").write_text(json.dumps(summary, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
