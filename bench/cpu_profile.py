"""Where the CPU goes during a benchmark run: per process (psutil) and per function (py-spy)."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

PY_SPY = Path(sys.executable).parent / "py-spy"

# Which stage of the request path a frame belongs to, by the file it is in (py-spy shows
# paths relative to site-packages or the project). First match wins, innermost frame first.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("auth", ("app/accounts/auth.py", "app/accounts/keystore/")),
    ("rate limits and usage", ("app/limits", "app/usage", "limits/")),
    ("SSE and chunk encoding", ("app/openai/sse.py", "sse_starlette/", "orjson")),
    ("request validation", ("app/openai/protocol.py", "pydantic/", "pydantic_core")),
    ("our routes and dispatch", ("app/", "deployments/")),
    ("HTTP server and ASGI", ("uvicorn/", "starlette/", "fastapi/", "h11/", "httptools/")),
    ("tokenizer", ("transformers/", "tokenizers/")),
    ("vLLM front end (detokenise, output)", ("vllm/",)),
    ("Ray Serve (handles, router, replica)", ("ray/serve/",)),
    ("Ray core (task and object transport)", ("ray/", "grpc/")),
    ("threads and futures", ("concurrent/", "threading.py", "queue.py")),
    ("asyncio event loop", ("asyncio/", "uvloop")),
)
# Frames that mean the thread is waiting, not working: such samples are left out.
IDLE_LEAVES = (
    "main_loop (ray/_private/worker.py",
    "run (threading.py",
    "_run_router_event_loop",
    "_run_user_code_event_loop",
    "select (selectors.py",
    "wait (threading.py",
)


@dataclass
class CpuProfile:
    pids: dict[str, int]
    out_dir: Path
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "wall_seconds": round(self.wall_seconds, 1),
            "cpu_seconds": {k: round(v, 2) for k, v in self.cpu_seconds.items()},
            "stages": {role: stage_shares(self.out_dir / f"{role}.raw") for role in self.pids},
            "top_functions": {
                role: top_functions(self.out_dir / f"{role}.raw") for role in self.pids
            },
        }


def _cpu_times(role: str, pid: int) -> float:
    """CPU seconds of a process; for an engine role, with its workers (vLLM's compute runs there)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in [root, *(root.children(recursive=True) if role.startswith("engine") else [])]:
            times = proc.cpu_times()
            total += times.user + times.system
    except psutil.NoSuchProcess:
        pass
    return total


@contextmanager
def cpu_profile(pids: dict[str, int], out_dir: Path, sample: bool = True) -> Iterator[CpuProfile]:
    """CPU seconds of `pids` (role -> pid) while the block runs, and (`sample`) py-spy's
    samples of them; without py-spy the counters are those of an unperturbed run."""
    result = CpuProfile(pids, out_dir)
    samplers = [
        subprocess.Popen(
            [
                str(PY_SPY),
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--nonblocking",
                "--output",
                str(out_dir / f"{role}.raw"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, pid in (pids.items() if sample else ())
    ]
    before = {role: _cpu_times(role, pid) for role, pid in pids.items()}
    started = time.monotonic()
    try:
        yield result
    finally:
        result.wall_seconds = time.monotonic() - started
        result.cpu_seconds = {
            role: _cpu_times(role, pid) - before[role] for role, pid in pids.items()
        }
        for sampler in samplers:
            sampler.send_signal(signal.SIGINT)
        for sampler in samplers:
            sampler.wait(30)


def _samples(raw: Path) -> Iterator[tuple[list[str], int]]:
    if not raw.exists():
        return
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if frames and not any(
            frames[-1].startswith(idle) or idle in frames[-1] for idle in IDLE_LEAVES
        ):
            yield frames, int(count)


def stage_shares(raw: Path) -> dict[str, float]:
    """Share (percent) of the busy samples of one process spent in each stage."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, count in _samples(raw):
        counts[_stage(frames)] += count
    total = sum(counts.values()) or 1
    return {stage: round(100 * n / total, 1) for stage, n in counts.most_common()}


def _stage(frames: list[str]) -> str:
    for frame in reversed(frames):
        path = frame.rpartition("(")[2]
        for stage, markers in STAGES:
            if any(path.startswith(m) or f"/{m}" in path for m in markers):
                return stage
    return "native or unattributed"


def top_functions(raw: Path, n: int = 12) -> list[tuple[str, float]]:
    """The functions with the most busy samples of their own (leaf frames), in percent."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, count in _samples(raw):
        counts[frames[-1]] += count
    total = sum(counts.values()) or 1
    return [(name, round(100 * c / total, 1)) for name, c in counts.most_common(n)]
