"""A bench stopped with SIGTERM stops the servers it started (its `with` blocks run)."""

from __future__ import annotations

import signal
import subprocess
import sys

BENCH = """
import sys, time
from contextlib import contextmanager
from bench.servers import stop_servers_on_sigterm

@contextmanager
def server():
    try:
        yield
    finally:
        print("stopped", flush=True)

stop_servers_on_sigterm()
with server():
    print("serving", flush=True)
    time.sleep(120)
"""


def test_sigterm_unwinds_the_bench_and_stops_its_servers():
    bench = subprocess.Popen([sys.executable, "-c", BENCH], stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout.readline().strip() == "serving"
        bench.send_signal(signal.SIGTERM)
        assert bench.stdout.readline().strip() == "stopped"
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        bench.kill()
