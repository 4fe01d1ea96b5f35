"""`make bench`: vLLM's own load generator against a bare vLLM server and this service, side by side.

    python -m bench.run serving   # 64 in / 64 out tokens at concurrency 1, 8, 32 (the budget)
    python -m bench.run gateway   # one-token replies at concurrency 1 and 64, with CPU profiles

Both servers run the same generated tiny model with the same engine arguments (those of
ServiceAi-Fast in serve_config.yaml). Runs alternate between the two so that machine drift
hits both. Results go to bench/results/; the serving table is also written into README.md.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

from bench import cpu_profile, report
from bench.servers import (
    FRONT_ENDS,
    PROJECT_ROOT,
    Server,
    bare_pids,
    bare_vllm,
    free_port,
    ray_serve_llm,
    replica_pids,
    serviceai,
)
from deployments.config import tiny_model_dir
from deployments.tiny_model import ensure

RESULTS = PROJECT_ROOT / "bench" / "results"
STACK_LOCK = Path(tempfile.gettempdir()) / "serviceai-stack.lock"

# Extra environment for the service's Ray cluster, on top of app.serve_runtime (experiments).
SERVE_ENV: dict[str, str] = {}

SERVING = {"input_len": 64, "output_len": 64, "concurrency": {1: 40, 8: 160, 32: 320}}
GATEWAY = {"input_len": 16, "output_len": 1, "concurrency": {1: 200, 64: 1600}}
# Ray Serve LLM's two modes (issue 5): name in the results -> direct streaming.
RAY_LLM_MODES = {"ray-llm": False, "ray-llm-direct": True}
METRICS = (
    "output_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
    "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms",
)


def vllm_bench(server: Server, model_dir: Path, concurrency: int, prompts: int,
               input_len: int, output_len: int, out: Path) -> dict[str, Any]:
    """One `vllm bench serve` run; returns its JSON result."""
    command = [
        sys.executable, "-m", "bench.vllm_cli", "bench", "serve",
        "--backend", "openai-chat", "--base-url", server.base_url,
        "--endpoint", "/v1/chat/completions", "--model", server.model,
        "--tokenizer", str(model_dir), "--dataset-name", "random",
        "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--ignore-eos", "--max-concurrency", str(concurrency), "--num-prompts", str(prompts),
        "--num-warmups", str(min(concurrency, 8)), "--seed", "0", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
    ]
    env = {**os.environ, "OPENAI_API_KEY": server.api_key}
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=PROJECT_ROOT)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed against {server.name}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    if result.get("failed"):
        raise RuntimeError(f"{result['failed']} requests failed against {server.name}; see {out}")
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median over rounds of each metric."""
    medians = {m: statistics.median(r[m] for r in runs) for m in METRICS}
    per_token = [r["front_end_us_per_token"] for r in runs if "front_end_us_per_token" in r]
    if per_token:
        medians["front_end_us_per_token"] = statistics.median(per_token)
    return medians


def run_mode(mode: str, rounds: int, profile: bool, ray_llm: bool, cpu: bool = True) -> dict[str, Any]:
    """Bare vLLM against this service, then (with `ray_llm`) against each mode of Ray Serve LLM.

    Bare vLLM stays up throughout; each contender runs in its own phase, alternating with it,
    so every ratio compares two servers measured in the same minutes.
    """
    spec = SERVING if mode == "serving" else GATEWAY
    model_dir = ensure(tiny_model_dir())
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    raw = RESULTS / "raw" / f"{stamp}-{mode}"
    raw.mkdir(parents=True, exist_ok=True)
    contenders: dict[str, Callable[[], AbstractContextManager[Server]]] = {
        "ours": lambda: serviceai(free_port(), raw, SERVE_ENV)
    }
    if ray_llm:
        for name, direct in RAY_LLM_MODES.items():
            contenders[name] = partial(ray_serve_llm, model_dir, free_port(), raw, direct)
    runs: dict[str, list[dict[str, Any]]] = {}
    profiles: dict[str, dict[str, Any]] = {}
    with bare_vllm(model_dir, free_port(), raw) as bare:
        for name, start in contenders.items():
            with start() as contender:
                print(f"bare vLLM and {contender.name} ready; logs in {raw}", flush=True)
                for concurrency, prompts in spec["concurrency"].items():
                    for round_ in range(rounds):
                        order = (bare, contender) if round_ % 2 == 0 else (contender, bare)
                        for server in order:
                            key = report.bare_key(name) if server is bare else name
                            out = raw / f"{key}-c{concurrency}-r{round_}.json"
                            profiling = ((profile or mode == "gateway") and name == "ours"
                                         and round_ == 0 and concurrency > 1)
                            counting = cpu and name == "ours" and concurrency > 1
                            pids = ((replica_pids(contender) if server is contender else bare_pids(bare))
                                    if profiling or counting else {})
                            if not profiling:  # counters alone: the front ends, unperturbed
                                pids = {r: p for r, p in pids.items() if r in FRONT_ENDS}
                            with cpu_profile.cpu_profile(pids, raw, sample=profiling) as prof:
                                result = vllm_bench(server, model_dir, concurrency, prompts,
                                                    spec["input_len"], spec["output_len"], out)
                            if profiling:
                                profiles[f"{key}-c{concurrency}"] = prof.summary()
                            if counting:
                                result["front_end_cpu_s"] = prof.cpu_seconds
                                front = sum(v for r, v in prof.cpu_seconds.items() if r in FRONT_ENDS)
                                result["front_end_us_per_token"] = 1e6 * front / result["total_output_tokens"]
                            runs.setdefault(f"{key}-c{concurrency}", []).append(result)
                            print(f"  c={concurrency:<3} round {round_} {key:18}: "
                                  f"{result['output_throughput']:8.1f} tok/s  "
                                  f"{result['request_throughput']:7.2f} req/s  "
                                  f"TTFT p50 {result['median_ttft_ms']:7.1f} ms", flush=True)
    summary = {
        "mode": mode, "date": stamp, "machine": report.machine(), "spec": spec, "rounds": rounds,
        "serve_env": SERVE_ENV, "contenders": list(contenders),
        "results": {key: summarize(v) for key, v in runs.items()},
        "profile": profiles,
    }
    (RESULTS / f"{stamp}-{mode}.json").write_text(json.dumps(summary, indent=2))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("serving", "gateway"), nargs="?", default="serving")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true",
                        help="also profile the serving runs (py-spy; costs some throughput)")
    parser.add_argument("--no-cpu", dest="cpu", action="store_false",
                        help="skip reading the front ends' CPU counters (per output token, c > 1)")
    parser.add_argument("--ray-llm", action="store_true",
                        help="also measure Ray Serve LLM (default and direct streaming) against bare vLLM")
    parser.add_argument("--serve-env", action="append", default=[], metavar="VAR=VALUE",
                        help="extra environment of the service's Ray cluster (experiments)")
    args = parser.parse_args()
    SERVE_ENV.update(item.split("=", 1) for item in args.serve_env)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(STACK_LOCK, "w") as lock:
        print(f"waiting for {STACK_LOCK} (held while a test session or benchmark runs) ...", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = run_mode(args.mode, args.rounds, args.profile, args.ray_llm, args.cpu)
    if args.mode == "serving":
        table = report.serving_table(summary)
        if args.ray_llm:
            ray_table = report.ray_llm_table(summary)
            report.update_readme(PROJECT_ROOT / "README.md", summary, ray_table, section="ray-llm")
            (RESULTS / "latest-ray-llm.md").write_text(ray_table)
            print(ray_table)
        report.serving_chart(summary, RESULTS / "latest-serving.png")
        report.update_readme(PROJECT_ROOT / "README.md", summary, table)
    else:
        table = report.gateway_table(summary)
    (RESULTS / f"latest-{args.mode}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
