"""Plans under overload: a free flood and a pro trickle (`make bench-priority`).

ServiceAi-Fast on the tiny model with 8 engine slots (`max_num_seqs`), as the issue measured
bare vLLM. First a pro request alone, ten times (its unloaded TTFT); then 24 free streams of
300 tokens kept in flight (each one that ends is replaced) while a pro request of 30 tokens is
sent every half second, 20 times. TTFT p50/p99 per plan, side by side in one run:
- fcfs: vLLM's default; Serve holds what the 8 slots cannot take, first come first served;
- priority, no reserve: `scheduling_policy: priority`, requests wait in the replica in plan
  order (deployments.priority_gate) but every slot is anyone's;
- priority: the same, 1, 2 or 4 of the 8 slots kept for the first plan (the service's design;
  `reserved_slots`, default an eighth).
Results: bench/results/<stamp>-priority.json and a table on stdout (bench/NOTES.md).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.run import RESULTS
from bench.servers import (
    BENCH_LIMITS, BENCH_TYPE, Server, bench_target, free_port, provision_key, serviceai,
)

SLOTS = 8
FLOOD = 24
FLOOD_TOKENS = 300
PRO_TOKENS = 30
PRO_REQUESTS = 20
PRO_EVERY_S = 0.5
UNLOADED = 10
PLANS = {
    "free": {"priority": 10, BENCH_TYPE: BENCH_LIMITS},
    "pro": {"priority": 0, BENCH_TYPE: BENCH_LIMITS},
}
SETUPS: dict[str, dict[str, Any]] = {
    "fcfs": {"max_ongoing_requests": SLOTS},
    "priority, no reserve": {"max_ongoing_requests": 4 * SLOTS, "reserved_slots": 0,
                             "scheduling_policy": "priority"},
    "priority, 1 slot kept for pro (the default: an eighth)": {
        "max_ongoing_requests": 4 * SLOTS, "reserved_slots": 1, "scheduling_policy": "priority"},
    "priority, 2 slots kept for pro": {"max_ongoing_requests": 4 * SLOTS, "reserved_slots": 2,
                                       "scheduling_policy": "priority"},
    "priority, 4 slots kept for pro": {"max_ongoing_requests": 4 * SLOTS, "reserved_slots": 4,
                                       "scheduling_policy": "priority"},
}


async def ttft(client: httpx.AsyncClient, server: Server, key: str, tokens: int, text: str) -> float:
    body = {"model": server.model, "messages": [{"role": "user", "content": text}],
            "max_tokens": tokens, "stream": True, "ignore_eos": True}
    started = time.perf_counter()
    first = None
    async with client.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {key}"}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {") and '"choices":[{' in line:
                first = time.perf_counter()
    return (first or time.perf_counter()) - started


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "count": len(ordered)}


async def workload(server: Server, pro_key: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=100)) as client:
        await ttft(client, server, pro_key, PRO_TOKENS, "warm up")
        unloaded = [await ttft(client, server, pro_key, PRO_TOKENS, f"alone {n}") for n in range(UNLOADED)]
        free_ttfts: list[float] = []
        free_done: list[float] = []
        stop = asyncio.Event()

        async def free_stream(number: int) -> None:
            while not stop.is_set():
                free_ttfts.append(await ttft(client, server, server.api_key, FLOOD_TOKENS, f"flood {number}"))
                free_done.append(time.perf_counter())

        flood = [asyncio.ensure_future(free_stream(n)) for n in range(FLOOD)]
        await asyncio.sleep(3)  # the flood fills the slots and the queue
        window_start = time.perf_counter()
        pro = []
        for n in range(PRO_REQUESTS):
            pro.append(await ttft(client, server, pro_key, PRO_TOKENS, f"pro {n}"))
            await asyncio.sleep(PRO_EVERY_S)
        window = time.perf_counter() - window_start
        stop.set()
        free_in_window = sum(1 for done in free_done if done >= window_start)
        await asyncio.gather(*flood)
    return {
        "pro_unloaded": percentiles(unloaded),
        "pro_under_flood": percentiles(pro),
        "free_under_flood": percentiles(free_ttfts),
        "free_tokens_per_s_while_pro_ran": free_in_window * FLOOD_TOKENS / window,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| setup | pro TTFT alone p50 (ms) | pro under flood p50 / p99 (ms) | pro p50 / alone | "
        "free under flood p50 / p99 (ms) | free output tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        alone, pro, free = r["pro_unloaded"], r["pro_under_flood"], r["free_under_flood"]
        lines.append(
            f"| {name} | {alone['p50_ms']:.0f} | {pro['p50_ms']:.0f} / {pro['p99_ms']:.0f} | "
            f"{pro['p50_ms'] / alone['p50_ms']:.1f}x | {free['p50_ms']:.0f} / {free['p99_ms']:.0f} | "
            f"{r['free_tokens_per_s_while_pro_ran']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    target = bench_target(None, {}, [FLOOD], gpu=False)
    log_dir = Path(tempfile.mkdtemp(prefix="sai-priority-"))
    results: dict[str, dict[str, Any]] = {}
    for name, setup in SETUPS.items():
        settings = {key: value for key, value in setup.items() if key != "scheduling_policy"}
        engine_args = {**target.engine_args, "max_num_seqs": SLOTS}
        if "scheduling_policy" in setup:
            engine_args["scheduling_policy"] = setup["scheduling_policy"]
        settings["engine_args"] = engine_args
        print(f"{name} ...", flush=True)
        log_name = f"serviceai-{name.split(',')[0].replace(' ', '-')}-{len(results)}.log"
        with serviceai(target, free_port(), log_dir, {}, settings, log_name, PLANS) as server:
            pro_key = provision_key(f"sqlite+aiosqlite:///{server.ray_dir / 'keys.db'}",
                                    "pro@serviceai.local", "pro")
            results[name] = asyncio.run(workload(server, pro_key))
        print(f"  {results[name]}", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {
        "workload": {"slots": SLOTS, "flood": FLOOD, "flood_tokens": FLOOD_TOKENS,
                     "pro_tokens": PRO_TOKENS, "pro_requests": PRO_REQUESTS},
        "results": results, "logs": str(log_dir),
    }
    (RESULTS / f"{stamp}-priority.json").write_text(json.dumps(summary, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
