"""Bare vLLM against the service from bench.sh's JSON results (<tag>_<bare|ours>_c<C>_r<R>.json),
as a markdown table: the median over rounds of each figure, and the service's ratios to bare.

    python3 table.py RESULTS_DIR
"""

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

FIGURES = (
    "output_throughput",
    "request_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
)
STACKS = {"bare": "bare vLLM", "ours": "ServiceAi"}


def medians(folder: Path) -> dict[tuple[str, int], dict[str, Any]]:
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for f in sorted(folder.glob("*_c*_r*.json")):
        m = re.match(r".*_(bare|ours)_c(\d+)_r\d+\.json", f.name)
        if m:
            runs.setdefault((m[1], int(m[2])), []).append(json.loads(f.read_text()))
    return {
        key: {k: statistics.median(r[k] for r in rs) for k in FIGURES}
        | {"rounds": len(rs), "failed": sum(r.get("failed", 0) for r in rs)}
        for key, rs in runs.items()
    }


def table(folder: Path) -> str:
    med = medians(folder)
    lines = [
        "| c | stack | rounds | output tok/s | req/s | TTFT p50 / p99 (ms) | "
        "ITL p50 / p99 (ms) | E2E p50 (ms) | tok/s vs bare | TTFT p50 vs bare |",
        "|---:|---|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for c in sorted({c for _, c in med}):
        bare = med.get(("bare", c))
        for stack, name in STACKS.items():
            d = med.get((stack, c))
            if not d:
                continue
            tok = f"{d['output_throughput'] / bare['output_throughput']:.2f}x" if bare else "-"
            ttft = f"{d['median_ttft_ms'] / bare['median_ttft_ms']:.2f}x" if bare else "-"
            failed = f" ({d['failed']} failed)" if d["failed"] else ""
            lines.append(
                f"| {c} | {name}{failed} | {d['rounds']} | {d['output_throughput']:.0f} | "
                f"{d['request_throughput']:.1f} | {d['median_ttft_ms']:.1f} / "
                f"{d['p99_ttft_ms']:.1f} | {d['median_itl_ms']:.2f} / {d['p99_itl_ms']:.1f} | "
                f"{d['median_e2el_ms']:.0f} | {tok} | {ttft} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
