"""`make soak`: many concurrent streaming clients for a bounded time, a share of them leaving
mid-stream, against the real stack on the tiny model. Not part of `make test` (marker `soak`).

Passes when every finished stream is well formed, no engine request is left running at the
end, the ingress and engine processes' memory stays flat, and no ERROR line reaches the logs.
The figures go to bench/results/soak-*.json and are quoted in the README.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import PROJECT_ROOT, Stack
from tests.e2e.conftest import MODEL_TYPES

CLIENTS = int(os.environ.get("SOAK_CLIENTS", "64"))
DURATION_S = float(os.environ.get("SOAK_SECONDS", "60"))
DISCONNECT_SHARE = 0.3
WARM_UP_S = 10
SAMPLE_EVERY_S = 5
# Growth of a process's memory between the end of the warm-up and the end of the soak that
# still counts as flat: allocator noise and caches, not a per-request leak.
FLAT_RSS_GROWTH = 0.15

pytestmark = [pytest.mark.soak, pytest.mark.e2e]


@dataclass
class Tally:
    finished: int = 0
    disconnected: int = 0
    malformed: list[str] = field(default_factory=list)
    refused: dict[int, int] = field(default_factory=dict)
    tokens: int = 0


def check_stream(lines: list[str], model: str) -> int:
    """Raise unless `lines` is one well-formed stream; return its completion tokens."""
    assert lines[-1] == "data: [DONE]", lines[-3:]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert not [c for c in chunks if "error" in c], chunks[-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {(c["id"], c["created"], c["model"]) for c in chunks} == {
        (chunks[0]["id"], chunks[0]["created"], model)
    }
    *content, usage = chunks[1:]
    assert content[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert not [c for c in content[:-1] if c["choices"][0]["finish_reason"]]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1
    return usage["usage"]["completion_tokens"]


async def one_client(
    http: httpx.AsyncClient, model: str, deadline: float, rng: random.Random, tally: Tally
) -> None:
    while time.monotonic() < deadline:
        leave_after = rng.randint(1, 60) if rng.random() < DISCONNECT_SHARE else None
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "soak " * rng.randint(1, 50)}],
            "max_tokens": rng.randint(8, 128),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                tally.refused[response.status_code] = tally.refused.get(response.status_code, 0) + 1
                await response.aread()
                continue
            lines: list[str] = []
            async for line in response.aiter_lines():
                # ": ping" comments keep an idle connection open; clients skip them.
                if line and not line.startswith(":"):
                    lines.append(line)
                if leave_after is not None and len(lines) >= leave_after:
                    break
        if leave_after is not None and len(lines) >= leave_after and lines[-1] != "data: [DONE]":
            tally.disconnected += 1
            continue
        try:
            tally.tokens += check_stream(lines, model)
            tally.finished += 1
        except (AssertionError, ValueError, KeyError, IndexError) as exc:
            tally.malformed.append(f"{model}: {type(exc).__name__} {str(exc)[:300]} in {lines}")


def serve_processes(stack: Stack) -> dict[str, list[psutil.Process]]:
    """This stack's ingress replica, and each model replica with its engine processes."""
    found: dict[str, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        for name in ("Ingress", *MODEL_TYPES):
            if cmdline.startswith(f"ray::ServeReplica:serviceai:{name}") and str(
                stack.ray_dir
            ) in " ".join(proc.parent().cmdline()):
                found[name] = [proc, *proc.children(recursive=True)]
    assert set(found) == {"Ingress", *MODEL_TYPES}, found
    return found


def rss_mib(processes: list[psutil.Process]) -> float:
    return sum(p.memory_info().rss for p in processes) / 2**20


def error_lines(stack: Stack, offsets: dict[Path, int]) -> list[str]:
    """ERROR lines and tracebacks the logs gained since `offsets` were taken."""
    found = []
    for path in stack.log_files():
        with open(path, errors="replace") as log:
            log.seek(offsets.get(path, 0))
            found += [
                f"{path.name}: {line.strip()[:300]}"
                for line in log
                if " ERROR " in line or "Traceback" in line
            ]
    return found


async def test_soak(stack: Stack):
    processes = serve_processes(stack)
    offsets = {path: path.stat().st_size for path in stack.log_files()}
    tally = Tally()
    samples: list[dict[str, float]] = []

    async def sample_memory(deadline: float) -> None:
        started = time.monotonic()
        while time.monotonic() < deadline:
            samples.append(
                {
                    "t": round(time.monotonic() - started),
                    **{name: round(rss_mib(p), 1) for name, p in processes.items()},
                }
            )
            await asyncio.sleep(SAMPLE_EVERY_S)

    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(
        base_url=stack.origin,
        headers={"Authorization": f"Bearer {stack.api_key}"},
        timeout=60,
        limits=limits,
    ) as http:
        deadline = time.monotonic() + DURATION_S
        await asyncio.gather(
            sample_memory(deadline),
            # A type per client, spread evenly: 22/21/21 stay under the pro plan's 32 concurrent.
            *(
                one_client(
                    http, MODEL_TYPES[i % len(MODEL_TYPES)], deadline, random.Random(i), tally
                )
                for i in range(CLIENTS)
            ),
        )
    samples.append(
        {"t": round(DURATION_S), **{n: round(rss_mib(p), 1) for n, p in processes.items()}}
    )

    # Every request the clients abandoned must have left the engines.
    running = {}
    for _ in range(50):
        running = {m: await stack.handle(m).running_requests.remote() for m in MODEL_TYPES}
        if not any(running.values()):
            break
        await asyncio.sleep(0.2)
    warm = next(s for s in samples if s["t"] >= WARM_UP_S)
    growth = {name: round(samples[-1][name] / warm[name] - 1, 3) for name in processes}
    errors = error_lines(stack, offsets)
    figures = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "clients": CLIENTS,
        "seconds": DURATION_S,
        "disconnect_share": DISCONNECT_SHARE,
        **asdict(tally),
        "malformed": len(tally.malformed),
        "malformed_examples": tally.malformed[:3],
        "running_at_end": running,
        "rss_mib": samples,
        "rss_growth_after_warm_up": growth,
        "error_lines": len(errors),
    }
    out = PROJECT_ROOT / "bench" / "results" / f"soak-{datetime.now(UTC):%Y-%m-%d-%H%M}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "rss_mib"}, indent=2))

    assert tally.finished > CLIENTS and tally.disconnected > 0, figures
    assert not tally.malformed, tally.malformed[:5]
    assert not tally.refused, tally.refused
    assert not any(running.values()), running
    assert all(g < FLAT_RSS_GROWTH for g in growth.values()), growth
    assert not errors, errors[:10]
