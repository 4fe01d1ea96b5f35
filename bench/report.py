"""Tables, the chart and the docs/performance.md sections of a benchmark run."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHART = Path(__file__).resolve().parent / "results" / "latest-serving.png"
"""The serving benchmark's chart, as `make bench` draws it."""

# The overhead budget of issue 5, checked on every serving run that has the concurrencies it
# reads (a run with other --concurrency levels skips the rest).
BUDGET = (
    (
        "output tok/s at c=32 >= 0.9x bare",
        (32,),
        lambda r: r["ours-c32"]["output_throughput"] >= 0.9 * r["bare-c32"]["output_throughput"],
    ),
    (
        "TTFT p50 at c=1 <= bare + 10 ms",
        (1,),
        lambda r: r["ours-c1"]["median_ttft_ms"] <= r["bare-c1"]["median_ttft_ms"] + 10,
    ),
    (
        "TTFT p50 at c=32 <= 1.5x bare",
        (32,),
        lambda r: r["ours-c32"]["median_ttft_ms"] <= 1.5 * r["bare-c32"]["median_ttft_ms"],
    ),
    (
        "ITL p50 <= bare + 2 ms (c=1, 8, 32)",
        (1, 8, 32),
        lambda r: all(
            r[f"ours-c{c}"]["median_itl_ms"] <= r[f"bare-c{c}"]["median_itl_ms"] + 2
            for c in (1, 8, 32)
        ),
    ),
)


def gpu_names() -> list[str]:
    """The node's NVIDIA GPUs as nvidia-smi names them; none where the driver's tool is missing."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpus = ", ".join(f"{n}x {name}" for name, n in Counter(gpu_names()).items()) or "no GPU"
    python = platform.python_version()
    return f"{os.cpu_count()} cores ({cpu}), {memory_gib:.0f} GiB, {gpus}, Python {python}"


def _concurrencies(summary: dict[str, Any]) -> list[int]:
    return list(summary["spec"]["concurrency"])


def model_line(summary: dict[str, Any]) -> list[str]:
    """What both servers served, where it is not the tiny model (runs before it was recorded,
    and `make bench`'s, served the tiny one with serve_config.yaml's engine args)."""
    if summary.get("model", "tiny") == "tiny":
        return []
    return [
        f"Model: {summary['model']}; engine args of both servers: "
        f"{json.dumps(summary.get('engine_args', {}))}."
    ]


def processes_table(summary: dict[str, Any], n: int) -> str:
    """The service with one serving process and with `n` (deployments/serving_processes.py),
    and bare vLLM with one API server and with `n` (`--api-server-count`, vLLM's own design of
    the same), each against the bare vLLM runs of its own phase; CPU per output token by process."""
    return variants_table(
        summary, ("ours", f"ours-p{n}", "bare", f"bare-a{n}"), "Serving processes"
    )


def variants_table(summary: dict[str, Any], keys: tuple[str, ...], title: str) -> str:
    """Setups of a server (results keys: "ours", another setup of it, "bare" itself), each
    against the bare vLLM runs of its own phase; CPU per output token by process."""
    r = summary["results"]
    lines = [
        f"{title}, {summary['date']}: {summary['machine']}",
        "",
        "| c | server | tok/s (x bare) | TTFT p50 (x bare) | ITL p99 (x bare) "
        "| front end us/token | by process |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for c in _concurrencies(summary):
        for name in keys:
            o = r.get(f"{name}-c{c}")
            b = o if name == "bare" else r.get(f"{bare_key(name)}-c{c}")
            if not o or not b:
                continue
            per = o.get("front_end_us_per_token")
            roles = o.get("us_per_token_by_process", {})
            lines.append(
                f"| {c} | {name} | {o['output_throughput']:.0f} "
                f"({o['output_throughput'] / b['output_throughput']:.2f}) | "
                f"{o['median_ttft_ms']:.1f} ({o['median_ttft_ms'] / b['median_ttft_ms']:.2f}) | "
                f"{o['p99_itl_ms']:.1f} ({o['p99_itl_ms'] / b['p99_itl_ms']:.2f}) | "
                f"{'' if per is None else f'{per:.0f}'} | "
                + ", ".join(f"{role} {v:.0f}" for role, v in sorted(roles.items()))
                + " |"
            )
    return "\n".join(lines) + "\n"


def messages_table(summary: dict[str, Any]) -> str:
    """Anthropic's Messages API against chat: each against bare vLLM serving the same API in
    the same rounds (vLLM serves /v1/messages itself), and the two ratios side by side."""
    r = summary["results"]
    lines = [
        "Messages against chat: each API on the service against the same API on bare vLLM "
        "(Messages without --ignore-eos on both: Anthropic's API has none).",
        "",
        "| c | tok/s chat (x bare) | tok/s messages (x bare) | TTFT p50 chat (x bare) "
        "| TTFT p50 messages (x bare) | messages / chat, tok/s and TTFT |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for c in _concurrencies(summary):
        chat, chat_bare = r.get(f"ours-c{c}"), r.get(f"bare-c{c}")
        msg, msg_bare = r.get(f"ours-messages-c{c}"), r.get(f"bare-messages-c{c}")
        if not (chat and chat_bare and msg and msg_bare):
            continue
        tok = [
            o["output_throughput"] / b["output_throughput"]
            for o, b in ((chat, chat_bare), (msg, msg_bare))
        ]
        ttft = [
            o["median_ttft_ms"] / b["median_ttft_ms"]
            for o, b in ((chat, chat_bare), (msg, msg_bare))
        ]
        lines.append(
            f"| {c} | {chat['output_throughput']:.0f} ({tok[0]:.2f}) "
            f"| {msg['output_throughput']:.0f} ({tok[1]:.2f}) "
            f"| {chat['median_ttft_ms']:.1f} ({ttft[0]:.2f}) "
            f"| {msg['median_ttft_ms']:.1f} ({ttft[1]:.2f}) "
            f"| {tok[1] / tok[0]:.2f} / {ttft[1] / ttft[0]:.2f} |"
        )
    return "\n".join(lines) + "\n"


def serving_table(summary: dict[str, Any]) -> str:
    r = summary["results"]
    lines = [
        f"Serving benchmark, {summary['date']}: {summary['machine']}",
        *model_line(summary),
        f"`vllm bench serve`, openai-chat, random {summary['spec']['input_len']} in / "
        f"{summary['spec']['output_len']} out tokens, --ignore-eos, median of {summary['rounds']} "
        "alternating rounds. Times in ms.",
        "",
        "| c | tok/s bare | tok/s ours | ratio | TTFT p50 bare / ours (diff) | TTFT p99 bare / ours "
        "| ITL p50 bare / ours (diff) | ITL p99 bare / ours |",
        "|---:|---:|---:|---:|---|---|---|---|",
    ]
    for c in _concurrencies(summary):
        b, o = r[f"bare-c{c}"], r[f"ours-c{c}"]
        lines.append(
            f"| {c} | {b['output_throughput']:.0f} | {o['output_throughput']:.0f} | "
            f"{o['output_throughput'] / b['output_throughput']:.2f} | "
            f"{b['median_ttft_ms']:.1f} / {o['median_ttft_ms']:.1f} "
            f"({o['median_ttft_ms'] - b['median_ttft_ms']:+.1f}) | "
            f"{b['p99_ttft_ms']:.1f} / {o['p99_ttft_ms']:.1f} | "
            f"{b['median_itl_ms']:.2f} / {o['median_itl_ms']:.2f} "
            f"({o['median_itl_ms'] - b['median_itl_ms']:+.2f}) | "
            f"{b['p99_itl_ms']:.1f} / {o['p99_itl_ms']:.1f} |"
        )
    lines.append("")
    lines += front_end_lines(r, _concurrencies(summary))
    ran = {int(c) for c in _concurrencies(summary)}
    lines += [
        f"- {'PASS' if check(r) else 'FAIL'}: {name}"
        for name, needs, check in BUDGET
        if ran.issuperset(needs)
    ]
    for run, profile in (summary.get("profile") or {}).items():
        lines += ["", f"### Profile of {run}"]
        lines += profile_lines(profile)
    return "\n".join(lines) + "\n"


def front_end_lines(
    results: dict[str, Any], concurrencies: list[int], per: str = "output token"
) -> list[str]:
    """CPU per output token of everything on the path but the engine core and its worker:
    ours (ingress, model replica, Serve's proxy, HAProxy) against bare's api_server. With
    one-token replies (the gateway run) that is the CPU per request."""
    cells = []
    for c in concurrencies:
        b, o = results.get(f"bare-c{c}", {}), results.get(f"ours-c{c}", {})
        if "front_end_us_per_token" in b and "front_end_us_per_token" in o:
            ours, bare = o["front_end_us_per_token"], b["front_end_us_per_token"]
            cells.append(f"c={c} {ours:.0f} vs {bare:.0f} us ({ours / bare:.2f}x)")
    if not cells:
        return []
    return [
        f"Front-end CPU per {per}, ours vs bare's api_server (engine core and worker "
        "excluded): " + ", ".join(cells) + ".",
        "",
    ]


RAY_LLM_NAMES = {
    "ours": "ServiceAi",
    "ray-llm": "Ray Serve LLM, defaults",
    "ray-llm-direct": "Ray Serve LLM, direct streaming + HAProxy",
}


def bare_key(contender: str) -> str:
    """The results key of the bare runs a contender's phase alternated with ("bare-c32" for ours)."""
    return "bare" if contender == "ours" else f"bare-{contender}"


def ray_llm_table(summary: dict[str, Any]) -> str:
    """Each contender against the bare vLLM runs of its own phase: who keeps more of bare vLLM."""
    lines = [
        f"Against Ray Serve LLM, {summary['date']}: {summary['machine']}",
        *model_line(summary),
        "Each server alternates with the same bare vLLM server in its own phase; ratios are to "
        f"the bare runs of that phase (median of {summary['rounds']} rounds). Times in ms.",
        "",
        "| c | server | tok/s (x bare) | TTFT p50 (x bare) | TTFT p99 | ITL p50 / p99 "
        "| front-end CPU per token, us (x bare) |",
        "|---:|---|---:|---:|---:|---|---:|",
    ]
    for c, server, b, o in _against_bare(summary):
        lines.append(
            f"| {c} | {server} | {o['output_throughput']:.0f} "
            f"({o['output_throughput'] / b['output_throughput']:.2f}x) | "
            f"{o['median_ttft_ms']:.1f} ({o['median_ttft_ms'] / b['median_ttft_ms']:.2f}x) | "
            f"{o['p99_ttft_ms']:.1f} | {o['median_itl_ms']:.2f} / {o['p99_itl_ms']:.1f} | "
            f"{_cpu_cell(b, o)} |"
        )
    return "\n".join(lines) + "\n"


def _cpu_cell(bare: dict[str, Any], contender: dict[str, Any]) -> str:
    """A contender's front-end CPU per output token (per request in a gateway run) and its ratio
    to bare's api_server in the same phase; "-" where the run did not read the counters (c=1)."""
    if "front_end_us_per_token" not in bare or "front_end_us_per_token" not in contender:
        return "-"
    ours, theirs = contender["front_end_us_per_token"], bare["front_end_us_per_token"]
    return f"{ours:.0f} ({ours / theirs:.2f}x)"


def _against_bare(
    summary: dict[str, Any],
) -> Iterator[tuple[int, str, dict[str, Any], dict[str, Any]]]:
    """Each contender's run at each concurrency, with the bare run of its own phase:
    (c, server name, bare, contender)."""
    r = summary["results"]
    for c in _concurrencies(summary):
        for name in summary["contenders"]:
            yield c, RAY_LLM_NAMES.get(name, name), r[f"{bare_key(name)}-c{c}"], r[f"{name}-c{c}"]


def gateway_table(summary: dict[str, Any]) -> str:
    r = summary["results"]
    lines = [
        f"Gateway benchmark, {summary['date']}: {summary['machine']}",
        *model_line(summary),
        f"One-token replies ({summary['spec']['input_len']} in / 1 out), streamed; the full path "
        "(auth, limits, routing, SSE) against bare vLLM's own server. Median of "
        f"{summary['rounds']} alternating rounds; the profiles below are from a round of their "
        "own, not in the medians.",
        "",
        "| c | req/s bare | req/s ours | ratio | latency p50 bare / ours (ms) "
        "| latency p99 bare / ours (ms) |",
        "|---:|---:|---:|---:|---|---|",
    ]
    for c in _concurrencies(summary):
        b, o = r[f"bare-c{c}"], r[f"ours-c{c}"]
        ratio = o["request_throughput"] / b["request_throughput"]
        lines.append(
            f"| {c} | {b['request_throughput']:.1f} | {o['request_throughput']:.1f} | "
            f"{ratio:.2f} | "
            f"{b['median_e2el_ms']:.1f} / {o['median_e2el_ms']:.1f} | "
            f"{b['p99_e2el_ms']:.1f} / {o['p99_e2el_ms']:.1f} |"
        )
    lines += ["", *front_end_lines(r, _concurrencies(summary), per="request")]
    others = [name for name in summary.get("contenders", []) if name != "ours"]
    if others:  # --ray-llm: each against the bare runs of its own phase
        lines += [
            "Against Ray Serve LLM (each server against the bare runs of its own phase):",
            "",
            "| c | server | req/s (x bare) | latency p50 / p99 (ms) "
            "| front-end CPU per request, us (x bare) |",
            "|---:|---|---:|---|---:|",
        ]
        for c, server, b, o in _against_bare(summary):
            lines.append(
                f"| {c} | {server} | {o['request_throughput']:.1f} "
                f"({o['request_throughput'] / b['request_throughput']:.2f}x) | "
                f"{o['median_e2el_ms']:.1f} / {o['p99_e2el_ms']:.1f} | {_cpu_cell(b, o)} |"
            )
    for run, profile in (summary.get("profile") or {}).items():
        lines += ["", f"### Profile of {run}"]
        lines += profile_lines(profile)
    return "\n".join(lines) + "\n"


def profile_lines(profile: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if profile:
        wall = profile["wall_seconds"]
        lines += ["", f"CPU during the profiled run ({wall} s wall), in cores:", ""]
        lines += [f"- {role}: {sec / wall:.2f}" for role, sec in profile["cpu_seconds"].items()]
        for role, stages in profile["stages"].items():
            lines += ["", f"Busy samples of the {role} process by stage:", ""]
            lines += [f"- {share:5.1f}% {stage}" for stage, share in stages.items()]
            lines += ["", f"Top functions of the {role} process (own samples):", ""]
            lines += [f"- {share:5.1f}% `{name}`" for name, share in profile["top_functions"][role]]
    return lines


def serving_chart(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = summary["results"]
    cs = _concurrencies(summary)
    fig, (ttft, tput) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("bare", "bare vLLM"), ("ours", "ServiceAi")):
        ttft.plot(cs, [r[f"{key}-c{c}"]["median_ttft_ms"] for c in cs], marker="o", label=label)
        tput.plot(cs, [r[f"{key}-c{c}"]["output_throughput"] for c in cs], marker="o", label=label)
    ttft.set(title="TTFT p50 (ms)", xlabel="concurrency", xscale="log", xticks=cs, xticklabels=cs)
    tput.set(title="Output tokens/s", xlabel="concurrency", xscale="log", xticks=cs, xticklabels=cs)
    for ax in (ttft, tput):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"ServiceAi vs bare vLLM, tiny model, {summary['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def update_doc(doc: Path, summary: dict[str, Any], table: str, section: str = "serving") -> None:
    """Replace one benchmark section of a doc (between its markers) with this run's table; the
    chart's link is relative to the doc."""
    start, end = f"<!-- bench:{section}:start -->", f"<!-- bench:{section}:end -->"
    chart_path = os.path.relpath(CHART, doc.parent)
    chart = f"\n![TTFT and throughput]({chart_path})" if section == "serving" else ""
    block = f"{start}\n{table}{chart}\n{end}"
    text = doc.read_text()
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)
