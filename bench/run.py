"""`make bench`: vLLM's own load generator against a bare vLLM server and this service, side by side.

    python -m bench.run serving   # 64 in / 64 out tokens at concurrency 1, 8, 32 (the budget)
    python -m bench.run gateway   # one-token replies at concurrency 1 and 64, with CPU profiles
    python -m bench.run serving --model Qwen/Qwen2.5-1.5B-Instruct \
        --concurrency 1:32,32:320,128:1024,256:1536 \
        --engine-args '{"max_model_len": 2048, "gpu_memory_utilization": 0.4}'   # `make bench-gpu`

Both servers run the same generated tiny model with the same engine arguments (those of
ServiceAi-Fast in serve_config.yaml), or the model given with --model, with vLLM's defaults and
--engine-args. Runs alternate between the two so that machine drift hits both. Results go to
bench/results/; the serving table of the tiny model at the spec's concurrencies (`make bench`)
is also written into docs/performance.md.
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

from bench import cpu_profile, messages_backend, report
from bench.servers import (
    PROJECT_ROOT,
    BenchTarget,
    Server,
    bare_pids,
    bare_vllm,
    bench_target,
    free_port,
    front_end,
    ray_serve_llm,
    replica_pids,
    serviceai,
    stop_servers_on_sigterm,
)

RESULTS = PROJECT_ROOT / "bench" / "results"
PERFORMANCE_DOC = PROJECT_ROOT / "docs" / "performance.md"
STACK_LOCK = Path(tempfile.gettempdir()) / "serviceai-stack.lock"

# Extra environment for the service's Ray cluster, on top of app.serving.ray_runtime (experiments).
SERVE_ENV: dict[str, str] = {}

SERVING = {"input_len": 64, "output_len": 64, "concurrency": {1: 40, 8: 160, 32: 320}}
GATEWAY = {"input_len": 16, "output_len": 1, "concurrency": {1: 200, 64: 1600}}
# Ray Serve LLM's two modes (issue 5): name in the results -> direct streaming.
RAY_LLM_MODES = {"ray-llm": False, "ray-llm-direct": True}
DEPLOYED = "ours-deployed"
"""The contender with the type deployed as its own replica (`--deployed`): the local profile's
ServiceAi-Fast runs its engine in the ingress (in_ingress), production's types are deployed."""
METRICS = (
    "output_throughput",
    "request_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
)


# The APIs a run may load: vLLM's backend for each, its endpoint, and whether it can ignore
# the end of sequence (Anthropic's Messages has no `ignore_eos`: its replies end where the model
# ends them, on both servers alike).
APIS = {
    "chat": ("openai-chat", "/v1/chat/completions", True),
    "messages": (messages_backend.BACKEND, "/v1/messages", False),
}


def vllm_bench(
    server: Server,
    tokenizer: str,
    concurrency: int,
    prompts: int,
    input_len: int,
    output_len: int,
    out: Path,
    api: str = "chat",
) -> dict[str, Any]:
    """One `vllm bench serve` run of `api`; returns its JSON result."""
    backend, endpoint, ignore_eos = APIS[api]
    command = [
        sys.executable,
        "-m",
        "bench.vllm_cli",
        "bench",
        "serve",
        "--backend",
        backend,
        "--base-url",
        server.base_url,
        "--endpoint",
        endpoint,
        "--model",
        server.model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        *(["--ignore-eos"] if ignore_eos else []),
        "--max-concurrency",
        str(concurrency),
        "--num-prompts",
        str(prompts),
        "--num-warmups",
        str(min(concurrency, 8)),
        "--seed",
        "0",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]
    env = {**os.environ, "OPENAI_API_KEY": server.api_key}
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=PROJECT_ROOT)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"vllm bench serve failed against {server.name}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
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
    # Each front-end process's share: the hottest one sets a single engine's ceiling.
    by_role = [
        {role: 1e6 * s / r["total_output_tokens"] for role, s in r["front_end_cpu_s"].items()}
        for r in runs
        if "front_end_cpu_s" in r
    ]
    if by_role:
        medians["us_per_token_by_process"] = {
            role: round(statistics.median(d[role] for d in by_role if role in d), 1)
            for role in by_role[0]
        }
    return medians


def run_mode(
    mode: str,
    spec: dict[str, Any],
    target: BenchTarget,
    rounds: int,
    profile: bool,
    ray_llm: bool,
    cpu: bool = True,
    serving_processes: int = 1,
    apis: tuple[str, ...] = ("chat",),
    deployed: bool = False,
) -> dict[str, Any]:
    """Bare vLLM against this service, then (with `ray_llm`) against each mode of Ray Serve LLM.

    Bare vLLM stays up throughout; each contender runs in its own phase, alternating with it,
    so every ratio compares two servers measured in the same minutes.
    """
    tokenizer = target.model_path()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    raw = RESULTS / "raw" / f"{stamp}-{mode}"
    raw.mkdir(parents=True, exist_ok=True)
    contenders: dict[str, Callable[[], AbstractContextManager[Server]]] = {
        "ours": lambda: serviceai(target, free_port(), raw, SERVE_ENV)
    }
    if serving_processes > 1:
        # The same service with its model replica's serving layer in N processes
        # (deployments/serving_processes.py), beside "ours" (one) in the same run.
        contenders[f"ours-p{serving_processes}"] = partial(
            serviceai,
            target,
            free_port(),
            raw,
            SERVE_ENV,
            {"serving_processes": serving_processes},
            f"serviceai-p{serving_processes}.log",
        )
        # vLLM's own design of the same: `vllm serve --api-server-count N`, its own phase.
        contenders[f"bare-a{serving_processes}"] = partial(
            bare_vllm, target, free_port(), raw, serving_processes
        )
    if deployed:
        # The same service with the type deployed, a replica of its own (in_ingress off).
        contenders[DEPLOYED] = partial(
            serviceai,
            target,
            free_port(),
            raw,
            SERVE_ENV,
            {"in_ingress": False},
            "serviceai-deployed.log",
        )
    if ray_llm:
        for name, direct in RAY_LLM_MODES.items():
            contenders[name] = partial(ray_serve_llm, target, free_port(), raw, direct)
    runs: dict[str, list[dict[str, Any]]] = {}
    profiles: dict[str, dict[str, Any]] = {}
    with bare_vllm(target, free_port(), raw) as bare:
        for name, start in contenders.items():
            with start() as contender:
                print(f"bare vLLM and {contender.name} ready; logs in {raw}", flush=True)
                for concurrency, prompts in spec["concurrency"].items():
                    # Profiles come from a round of their own (-1): the sampler slows what it
                    # samples, so that round's figures are not in the medians.
                    # (--profile: every contender; the gateway mode: the service as configured)
                    profiled = (profile or mode == "gateway" and name == "ours") and concurrency > 1
                    for round_ in range(-1 if profiled else 0, rounds):
                        order = (bare, contender) if round_ % 2 == 0 else (contender, bare)
                        for server, api in [(s, a) for s in order for a in apis]:
                            key = report.bare_key(name) if server is bare else name
                            key += "" if api == "chat" else f"-{api}"
                            out = raw / f"{key}-c{concurrency}-r{round_}.json"
                            profiling = round_ < 0
                            counting = cpu and concurrency > 1 and not profiling
                            pids = (
                                (replica_pids(server) if server.ray_dir else bare_pids(server))
                                if profiling or counting
                                else {}
                            )
                            if not profiling:  # counters alone: the front ends, unperturbed
                                pids = {r: p for r, p in pids.items() if front_end(r)}
                            with cpu_profile.cpu_profile(pids, raw, sample=profiling) as prof:
                                result = vllm_bench(
                                    server,
                                    tokenizer,
                                    concurrency,
                                    prompts,
                                    spec["input_len"],
                                    spec["output_len"],
                                    out,
                                    api,
                                )
                            if profiling:
                                profiles[f"{key}-c{concurrency}"] = prof.summary()
                            if counting:
                                result["front_end_cpu_s"] = prof.cpu_seconds
                                front = sum(v for r, v in prof.cpu_seconds.items() if front_end(r))
                                result["front_end_us_per_token"] = (
                                    1e6 * front / result["total_output_tokens"]
                                )
                            if not profiling:
                                runs.setdefault(f"{key}-c{concurrency}", []).append(result)
                            print(
                                f"  c={concurrency:<3} round {round_} {key:18}: "
                                f"{result['output_throughput']:8.1f} tok/s  "
                                f"{result['request_throughput']:7.2f} req/s  "
                                f"TTFT p50 {result['median_ttft_ms']:7.1f} ms"
                                + ("  (profiled, not counted)" if profiling else ""),
                                flush=True,
                            )
    summary = {
        "mode": mode,
        "date": stamp,
        "machine": report.machine(),
        "spec": spec,
        "rounds": rounds,
        "model": target.model,
        "engine_args": target.engine_args,
        "serve_env": SERVE_ENV,
        "contenders": list(contenders),
        "apis": list(apis),
        "results": {key: summarize(v) for key, v in runs.items()},
        "profile": profiles,
    }
    (RESULTS / f"{stamp}-{mode}.json").write_text(json.dumps(summary, indent=2))
    return summary


def concurrency_arg(text: str) -> dict[int, int]:
    """`--concurrency 1:32,32:320`: concurrency -> prompts, in the order given."""
    levels: dict[int, int] = {}
    for item in text.split(","):
        concurrency, sep, prompts = item.strip().partition(":")
        if not (sep and concurrency.isdigit() and prompts.isdigit()):
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not CONCURRENCY:PROMPTS")
        if int(concurrency) < 1 or int(prompts) < 1:
            raise argparse.ArgumentTypeError(f"{item.strip()!r}: both numbers must be >= 1")
        if int(concurrency) in levels:
            raise argparse.ArgumentTypeError(f"concurrency {int(concurrency)} is given twice")
        levels[int(concurrency)] = int(prompts)
    return levels


def engine_args_arg(text: str) -> dict[str, Any]:
    """`--engine-args '{"max_model_len": 2048}'`: AsyncEngineArgs fields, as a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object of engine arguments")
    if "model" in value:
        raise argparse.ArgumentTypeError("give the model with --model")
    return value


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("serving", "gateway"), nargs="?", default="serving")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile each contender's serving runs, in a round of their own "
        "(py-spy; not counted in the medians)",
    )
    parser.add_argument(
        "--no-cpu",
        dest="cpu",
        action="store_false",
        help="skip reading the front ends' CPU counters (per output token, c > 1)",
    )
    parser.add_argument(
        "--ray-llm",
        action="store_true",
        help="also measure Ray Serve LLM (default and direct streaming) against bare vLLM",
    )
    parser.add_argument(
        "--serving-processes",
        type=int,
        default=1,
        metavar="N",
        help="also measure the service with N serving processes per engine (its own phase)",
    )
    parser.add_argument(
        "--deployed",
        action="store_true",
        help="also measure the service with the type deployed as a replica of its own "
        "(in_ingress: false, as production runs every type; its own phase)",
    )
    parser.add_argument(
        "--messages",
        action="store_true",
        help="also load Anthropic's Messages API on both servers, beside chat, each round",
    )
    parser.add_argument(
        "--serve-env",
        action="append",
        default=[],
        metavar="VAR=VALUE",
        help="extra environment of the service's Ray cluster (experiments)",
    )
    parser.add_argument(
        "--model",
        metavar="PATH_OR_HF_ID",
        help="serve this model on every server instead of the tiny one, with "
        "vLLM's default engine args plus --engine-args",
    )
    parser.add_argument(
        "--concurrency",
        type=concurrency_arg,
        metavar="C:PROMPTS,...",
        help="the runs to make, replacing the mode's own, e.g. 1:32,32:320",
    )
    parser.add_argument(
        "--engine-args",
        type=engine_args_arg,
        default={},
        metavar="JSON",
        help="engine args given identically to every server, e.g. "
        '\'{"max_model_len": 2048, "gpu_memory_utilization": 0.4}\' '
        "(servers on one GPU each need a share of its memory)",
    )
    return parser


def run_plan(args: argparse.Namespace, gpu: bool) -> tuple[dict[str, Any], BenchTarget]:
    """The mode's spec (with --concurrency's runs) and what every server serves."""
    spec = dict(SERVING if args.mode == "serving" else GATEWAY)
    if args.concurrency:
        spec["concurrency"] = args.concurrency
    target = bench_target(args.model, args.engine_args, list(spec["concurrency"]), gpu)
    return spec, target


def main() -> None:
    stop_servers_on_sigterm()
    args = parser().parse_args()
    spec, target = run_plan(args, gpu=bool(report.gpu_names()))
    # docs/performance.md's tables and latest-*.md are `make bench`'s: the tiny model at the
    # spec's runs.
    standard = (
        args.model is None
        and args.concurrency is None
        and not args.engine_args
        and args.serving_processes == 1
        and not args.deployed
    )
    SERVE_ENV.update(item.split("=", 1) for item in args.serve_env)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(STACK_LOCK, "w") as lock:
        print(
            f"waiting for {STACK_LOCK} (held while a test session or benchmark runs) ...",
            flush=True,
        )
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = run_mode(
            args.mode,
            spec,
            target,
            args.rounds,
            args.profile,
            args.ray_llm,
            args.cpu,
            args.serving_processes,
            ("chat", "messages") if args.messages else ("chat",),
            args.deployed,
        )
    if args.mode == "serving":
        table = report.serving_table(summary)
        if args.messages:
            table += "\n" + report.messages_table(summary)
        ray_table = report.ray_llm_table(summary) if args.ray_llm else ""
        if standard and args.ray_llm:
            report.update_doc(PERFORMANCE_DOC, summary, ray_table, section="ray-llm")
            (RESULTS / "latest-ray-llm.md").write_text(ray_table)
        if standard:
            report.serving_chart(summary, report.CHART)
            report.update_doc(PERFORMANCE_DOC, summary, table)
        extra = ray_table
        if args.serving_processes > 1:
            extra += report.processes_table(summary, args.serving_processes)
        if args.deployed:
            extra += report.variants_table(summary, ("ours", DEPLOYED), "The type deployed")
        if extra:
            print(extra)
    else:
        table, extra = report.gateway_table(summary), ""
    if standard:
        (RESULTS / f"latest-{args.mode}.md").write_text(table)
    else:
        (RESULTS / f"{summary['date']}-{args.mode}.md").write_text(table + extra)
    print(table)


if __name__ == "__main__":
    main()
