"""CPU per process during the busy part of each run, from cpu_snap.py's samples (bench.sh writes
them as logs/cpu_<run>.txt at c >= 128). Busy: the samples over which the run's vLLM engine core
(the busiest one) used more than 30% of a core. 100% is one core. Prints a markdown table. A
role held by several busy processes (a gang's members, `vllm serve --api-server-count`'s API
servers) shows their sum, their count and the hottest one: one process's share is the ceiling.

    python3 cpu_table.py LOGS_DIR
"""

import sys
from pathlib import Path
from typing import Any

ROLES = (
    ("Ingress", "ServeReplica:serviceai:Ingress"),
    ("model replica", "ServeReplica:serviceai:ServiceAi-Fast"),
    ("Pro replicas", "ServeReplica:serviceai:ServiceAi-Pro"),
    # one API server: the module's own process (gpu_run.sh), or `vllm serve`'s (processes_bench.sh)
    ("bare API server", ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main serve")),
    ("bare API servers", "VLLM::APIServer"),
    ("EngineCore", "VLLM::EngineCore"),
    ("HAProxy", "haproxy"),
    ("ProxyActor", "ProxyActor"),
    ("bench client", "bench serve"),
    ("raylet", "raylet/raylet"),
    ("gcs_server", "gcs_server"),
    ("ServeController", "ServeController"),
)
HOT_THREADS = ("Ingress", "model replica", "Pro replicas", "bare API server", "EngineCore")
BUSY = 5.0
"""Percent of a core over the window below which a process is not counted as one of its role's."""
TICKS_PER_S = 100


def parse(path: Path) -> list[dict[str, Any]]:
    snaps: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        f = line.split(" ", 3 if line.startswith("P ") else 4)
        if f[0] == "T":
            snaps.append({"t": float(f[1]), "P": {}, "H": {}, "cmd": {}})
        elif f[0] == "P" and snaps:
            snaps[-1]["P"][int(f[1])] = int(f[2])
            snaps[-1]["cmd"][int(f[1])] = f[3] if len(f) > 3 else ""
        elif f[0] == "H" and snaps:
            snaps[-1]["H"][(int(f[1]), int(f[2]))] = (int(f[3]), f[4] if len(f) > 4 else "")
    return snaps


def busy_window(s: list[dict[str, Any]], engine: int) -> tuple[int, int]:
    """First and last sample of the stretch where `engine` used > 30% of a core."""
    busy = [
        i
        for i in range(1, len(s))
        if (s[i]["P"].get(engine, 0) - s[i - 1]["P"].get(engine, 0))
        / TICKS_PER_S
        / (s[i]["t"] - s[i - 1]["t"])
        > 0.3
    ]
    return busy[0] - 1, busy[-1]


def shares(path: Path) -> dict[str, Any]:
    """Per role: share of a core over the busy window, and its hottest thread's."""
    s = parse(path)
    cmd: dict[int, str] = {}
    for snap in s:
        cmd.update(snap["cmd"])
    cores = [p for p, c in cmd.items() if "EngineCore" in c]
    engine = max(cores, key=lambda p: s[-1]["P"].get(p, 0) - s[0]["P"].get(p, 0))
    a, b = busy_window(s, engine)
    window = s[b]["t"] - s[a]["t"]
    out: dict[str, Any] = {"window_s": window}
    for role, pattern in ROLES:
        patterns = (pattern,) if isinstance(pattern, str) else pattern
        pids = [
            p
            for p, c in cmd.items()
            if any(m in c for m in patterns) and (role != "EngineCore" or p == engine)
        ]
        if not pids:
            continue
        # a process born inside the window counts from its first sample
        used = [s[b]["P"].get(p, 0) - s[a]["P"].get(p, s[b]["P"].get(p, 0)) for p in pids]
        each = [100 * u / TICKS_PER_S / window for u in used]
        out[role] = sum(each)
        busy = [e for e in each if e >= BUSY]
        if len(busy) > 1:
            out[role + " processes"] = (len(busy), max(busy))
        hot = [
            (
                s[b]["H"][k][0] - s[a]["H"].get(k, (s[b]["H"][k][0],))[0],
                "main" if k[0] == k[1] else s[b]["H"][k][1],
            )
            for k in s[b]["H"]
            if k[0] in pids
        ]
        if hot:
            t, name = max(hot)
            out[role + " hot"] = (100 * t / TICKS_PER_S / window, name)
    return out


def table(folder: Path) -> str:
    runs = {f.stem[4:]: shares(f) for f in sorted(folder.glob("cpu_*.txt"))}
    roles = [r for r, _ in ROLES if any(r in shares_ for shares_ in runs.values())]
    lines = [
        "| run | busy window (s) | " + " | ".join(roles) + " |",
        "|---|---:|" + "---:|" * len(roles),
    ]
    for run, r in runs.items():
        cells = []
        for role in roles:
            if role not in r:
                cells.append("-")
                continue
            hot = r.get(role + " hot")
            cell = f"{r[role]:.0f}%"
            if role + " processes" in r:
                count, hottest = r[role + " processes"]
                cell += f" in {count} processes, hottest {hottest:.0f}%"
            if hot and r[role] >= 10 and role in HOT_THREADS:
                cell += f" ({hot[1]} thread {hot[0]:.0f}%)"
            cells.append(cell)
        lines.append(f"| {run} | {r['window_s']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
