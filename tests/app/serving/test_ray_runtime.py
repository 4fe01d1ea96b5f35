"""The environment each Ray cluster of this project starts with (app/serving/ray_runtime.py)."""

from __future__ import annotations

import socket
from itertools import count
from pathlib import Path

import pytest
from ray.serve._private import constants

from app.serving import ray_runtime
from app.serving.ray_runtime import (
    FIRST_FREE_PORT,
    ONE_MACHINE_ENV,
    PER_MACHINE_PORTS,
    SERVE_ENV,
    SERVE_REPLICA_PORTS,
    cluster_env,
    free_port,
)


def test_two_clusters_on_one_machine_share_no_port_and_no_haproxy_file():
    ports = count(20000)
    first = cluster_env(Path("/tmp/sai-h-1"), lambda: next(ports))
    second = cluster_env(Path("/tmp/sai-h-2"), lambda: next(ports))
    shared = SERVE_ENV | ONE_MACHINE_ENV
    assert shared.items() <= first.items()
    mine = {name: value for name, value in first.items() if name not in shared}
    theirs = {name: value for name, value in second.items() if name not in shared}
    assert mine.keys() == theirs.keys() >= set(PER_MACHINE_PORTS)
    assert not set(mine.values()) & set(theirs.values())


@pytest.mark.parametrize("name", [*PER_MACHINE_PORTS, *ONE_MACHINE_ENV])
def test_each_setting_is_one_ray_serve_reads_from_the_environment(name):
    # A renamed variable would silently put a second cluster back on Serve's fixed port, or
    # every stop of `serviceai run` back to Ray's 30 s drain.
    assert hasattr(constants, name)


def test_a_state_dir_too_long_for_haproxys_socket_path_is_refused():
    with pytest.raises(ValueError, match="97"):
        cluster_env(Path("/tmp/a-folder-name-far-too-long-for-haproxy"))


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_free_ports_are_never_handed_out_twice_and_stay_out_of_the_ephemeral_range():
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if ephemeral_low() > FIRST_FREE_PORT + 1000:
        assert all(FIRST_FREE_PORT <= port < ephemeral_low() for port in ports)


def test_a_port_something_listens_on_is_passed_over(monkeypatch):
    if ephemeral_low() <= FIRST_FREE_PORT + 1000:
        pytest.skip("this kernel's ephemeral range leaves no room below it")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        taken = listener.getsockname()[1]
        picks = iter([taken, taken + 1])
        monkeypatch.setattr(ray_runtime._PICK, "randrange", lambda *_: next(picks))
        monkeypatch.setattr(ray_runtime, "_HANDED_OUT", set())  # as if another process chose it
        assert free_port() == taken + 1


def test_a_port_serves_replicas_take_for_their_own_servers_is_passed_over(monkeypatch):
    # Free now, but the next replica to start on this machine binds it (a rehearsal node's
    # HAProxy failed on 30001: "cannot bind socket").
    if ephemeral_low() <= FIRST_FREE_PORT + 1000:
        pytest.skip("this kernel's ephemeral range leaves no room below it")
    picks = iter([SERVE_REPLICA_PORTS[1], SERVE_REPLICA_PORTS[-1], SERVE_REPLICA_PORTS[0] - 7])
    monkeypatch.setattr(ray_runtime._PICK, "randrange", lambda *_: next(picks))
    monkeypatch.setattr(ray_runtime, "_HANDED_OUT", set())
    assert free_port() == SERVE_REPLICA_PORTS[0] - 7
