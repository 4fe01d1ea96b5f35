"""CPU time of the serving processes, sampled from /proc (bench.sh runs it at c >= 128).

    python3 cpu_snap.py INTERVAL_S   # one snapshot every INTERVAL_S until killed; 0: once

A snapshot is a line `T <epoch s>`, then for each process with more than 0.5 s of CPU
`P pid ticks cmdline[:120]` (ticks: utime + stime, 1/100 s), and for the processes that serve
(Serve replicas and proxy, vLLM engine cores and API servers, HAProxy) each thread above 0.5 s:
`H pid tid ticks comm`. It never fails the benchmark: any error ends it quietly.
"""

import os
import sys
import time
from typing import TextIO

WATCH = (
    "ServeReplica",
    "EngineCore",
    "haproxy",
    "ProxyActor",
    "api_server",
    "cli.main serve",
    "APIServer",
    "ServeController",
)
MIN_TICKS = 50


def ticks(stat: str) -> int:
    """utime + stime (fields 14 and 15 of /proc/PID/stat; the name may hold spaces)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def threads(pid: str) -> list[str]:
    lines = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                used = ticks(fh.read())
            if used < MIN_TICKS:
                continue
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                lines.append(f"H {pid} {tid} {used} {fh.read().strip()}")
        except OSError:
            pass
    return lines


def snap(out: TextIO) -> None:
    lines = [f"T {time.time():.3f}"]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                used = ticks(fh.read())
            if used < MIN_TICKS:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
            lines.append(f"P {pid} {used} {cmd}")
            if any(w in cmd for w in WATCH):
                lines += threads(pid)
        except (OSError, ValueError, IndexError):
            pass
    out.write("\n".join(lines) + "\n")
    out.flush()


if __name__ == "__main__":
    try:
        interval = float(sys.argv[1]) if len(sys.argv) > 1 else 0
        while True:
            snap(sys.stdout)
            if interval <= 0:
                break
            time.sleep(interval)
    except BaseException:
        pass
