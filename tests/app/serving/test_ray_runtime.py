"""The environment each Ray cluster of this project starts with (app/serving/ray_runtime.py)."""

from __future__ import annotations

from itertools import count
from pathlib import Path

import pytest

from app.serving.ray_runtime import PER_MACHINE_PORTS, SERVE_ENV, cluster_env
from ray.serve._private import constants


def test_two_clusters_on_one_machine_share_no_port_and_no_haproxy_file():
    ports = count(20000)
    first = cluster_env(Path("/tmp/sai-h-1"), lambda: next(ports))
    second = cluster_env(Path("/tmp/sai-h-2"), lambda: next(ports))
    assert SERVE_ENV.items() <= first.items()
    mine = {name: value for name, value in first.items() if name not in SERVE_ENV}
    theirs = {name: value for name, value in second.items() if name not in SERVE_ENV}
    assert mine.keys() == theirs.keys() >= set(PER_MACHINE_PORTS)
    assert not set(mine.values()) & set(theirs.values())


@pytest.mark.parametrize("name", PER_MACHINE_PORTS)
def test_each_port_is_one_ray_serve_reads_from_the_environment(name):
    # A renamed variable would silently put a second cluster back on Serve's fixed port.
    assert hasattr(constants, name)


def test_a_state_dir_too_long_for_haproxys_socket_path_is_refused():
    with pytest.raises(ValueError, match="97"):
        cluster_env(Path("/tmp/a-folder-name-far-too-long-for-haproxy"))
