"""A bench stopped with SIGTERM stops the servers it started (its `with` blocks run)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from bench.servers import Server, replica_pids

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


# A Ray node's layout as `replica_pids` reads it: replicas are children of a process whose
# command line names the cluster's temp dir; a model replica's children hold the engine core.
INGRESS = '(exec -a "ray::ServeReplica:app:Ingress" sleep 60) &'
MODEL = (
    '(exec -a "ray::ServeReplica:app:Fast" bash -c "(exec -a VLLM::EngineCore sleep 60) & wait") &'
)
REPLACED = '(exec -a "ray::ServeReplica:app:Ingress" sleep 2) &'


@contextmanager
def ray_node(tmp_path, *replicas: str, expected: int):
    """A fake raylet (its command line names `tmp_path`) running `replicas`, once all
    `expected` processes below it have started."""
    import psutil

    raylet = subprocess.Popen(["bash", "-c", " ".join(replicas) + " wait", str(tmp_path)])
    try:
        deadline = time.monotonic() + 30
        while len(psutil.Process(raylet.pid).children(recursive=True)) < expected:
            assert time.monotonic() < deadline, "the fake node did not start"
            time.sleep(0.05)
        yield Server("fake", "http://127.0.0.1:1", "unused", "fast", ray_dir=tmp_path)
    finally:
        for child in psutil.Process(raylet.pid).children(recursive=True):
            child.kill()
        raylet.kill()
        raylet.wait()


def test_replica_pids_tells_the_model_replica_by_its_engine(tmp_path):
    import psutil

    with ray_node(tmp_path, INGRESS, MODEL, expected=3) as server:
        pids = replica_pids(server, settle_s=0)
        titles = {role: psutil.Process(pid).cmdline()[0] for role, pid in pids.items()}
    assert titles == {
        "ingress": "ray::ServeReplica:app:Ingress",
        "model": "ray::ServeReplica:app:Fast",
        "engine_core": "VLLM::EngineCore",
    }


def test_replica_pids_waits_out_a_replica_being_replaced(tmp_path):
    with ray_node(tmp_path, INGRESS, REPLACED, MODEL, expected=4) as server:
        pids = replica_pids(server, settle_s=20)
    assert set(pids) == {"ingress", "model", "engine_core"}


def test_replica_pids_names_both_replicas_of_a_clash_that_stays(tmp_path):
    with ray_node(tmp_path, INGRESS, INGRESS, expected=2) as server:
        with pytest.raises(RuntimeError, match="two ingress replicas") as error:
            replica_pids(server, settle_s=0.5)
    assert str(error.value).count("ray::ServeReplica:app:Ingress") == 2
