"""Where a streamed request's time to first token goes, hop by hop, under `make bench`'s load.

    git apply bench/probes/ttft_hops.patch      # timestamps in the request path (scratch only)
    .venv/bin/python -m bench.probes.ttft_hops --rounds 2 [--model-type '{"serving_processes": 2}']
        [--engine-args '{"max_num_seqs": 32}']
    git apply -R bench/probes/ttft_hops.patch

The patch makes every process on a request's path append `<request> <stage> <perf_counter>` to
/tmp/probe/t-<pid>.txt (perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process),
and the model replica log each time its event loop wakes a 1 ms timer more than 2 ms late. This
runs the service as `make bench` does (the tiny model, ServiceAi-Fast alone) under `vllm bench
serve` chat 64/64 at c=32 (or --concurrency), then prints the median of each hop and how late
the replica's loop ran. Never commit the patch applied: it writes a line per hop per request.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import glob
import json
import shutil
import statistics
from pathlib import Path

from app.serving.ray_runtime import free_port
from bench.run import SERVE_ENV, STACK_LOCK, vllm_bench
from bench.servers import bench_target, serviceai

PROBE_DIR = Path("/tmp/probe")
HOPS = {
    "ab": "HAProxy's request in the ingress -> handler (body, key, validation)",
    "bc": "handler -> admitted (checks, counters in Redis)",
    "cd": "admitted -> dispatched",
    "dr": "dispatched -> the request router's choice (ingress loop)",
    "re": "router -> the replica's stream() (gRPC, Serve, the replica's loop)",
    "ef": "replica: serving layer, engine queue, prefill, first part",
    "fg": "first part -> the ingress",
    "ah": "the ingress's whole share up to the first part",
}


def read() -> tuple[list[dict[str, float]], list[tuple[float, float]]]:
    """Each request's stages, and the replica loop's late wake-ups (when, how late)."""
    stages: dict[str, dict[str, float]] = collections.defaultdict(dict)
    late: list[tuple[float, float]] = []
    for path in glob.glob(str(PROBE_DIR / "t-*.txt")):
        when = 0.0
        for line in Path(path).read_text().splitlines():
            request, stage, t = line.split()
            if request != "lag":
                stages[request][stage] = float(t)
            elif stage == "L":
                when = float(t)
            else:
                late.append((when, float(t)))
    complete = [s for s in stages.values() if all(k in s for k in "abcdrefgh")]
    return complete, late


def report(complete: list[dict[str, float]], late: list[tuple[float, float]]) -> None:
    if not complete:
        print("no request timed: `git apply bench/probes/ttft_hops.patch` first")
        return
    print(f"{len(complete)} requests timed at every hop")
    for hop, what in HOPS.items():
        ms = sorted(1000 * (s[hop[1]] - s[hop[0]]) for s in complete)
        p90 = ms[int(0.9 * len(ms))]
        print(f"  {what:68s} p50 {statistics.median(ms):6.1f}  p90 {p90:6.1f} ms")
    start, end = min(s["a"] for s in complete), max(s["h"] for s in complete)
    during = [m for when, m in late if start <= when <= end]
    if during:
        print(
            f"  replica loop: {len(during)} wake-ups > 2 ms late in {end - start:.1f} s, "
            f"p50 {1000 * statistics.median(during):.1f} ms, max {1000 * max(during):.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-type", type=json.loads, default=None, help="settings on top")
    parser.add_argument("--engine-args", type=json.loads, default={}, help="engine args on top")
    parser.add_argument("--concurrency", type=int, default=32, help="requests: ten times as many")
    args = parser.parse_args()
    out = PROBE_DIR / "runs"
    shutil.rmtree(PROBE_DIR, ignore_errors=True)
    out.mkdir(parents=True)
    target = bench_target(None, args.engine_args, [args.concurrency], False)
    c = args.concurrency
    with open(STACK_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with serviceai(target, free_port(), out, SERVE_ENV, args.model_type) as ours:
            for round_ in range(args.rounds):
                result = vllm_bench(
                    ours, target.model_path(), c, 10 * c, 64, 64, out / f"{round_}.json"
                )
                print(
                    f"round {round_}: TTFT p50 {result['median_ttft_ms']:.1f} ms, ITL p99 "
                    f"{result['p99_itl_ms']:.1f} ms, {result['output_throughput']:.0f} tok/s"
                )
    report(*read())


if __name__ == "__main__":
    main()
