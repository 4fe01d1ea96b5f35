"""Ray Serve's private attributes the service reads: present in the pinned Ray, and a Ray that
moved them fails the check a replica makes at start, naming the attribute."""

from __future__ import annotations

import pytest

from deployments import ray_internals


def test_the_pinned_ray_sets_every_attribute_read():
    ray_internals.check()


def test_a_ray_without_one_fails_at_start_naming_it(monkeypatch):
    read = dict(ray_internals.READ)
    read[ray_internals.AsyncioRouter] = ("_running_replicas", "_renamed_in_a_later_ray")
    monkeypatch.setattr(ray_internals, "READ", read)
    with pytest.raises(RuntimeError, match="AsyncioRouter no longer sets _renamed_in_a_later_ray"):
        ray_internals.check()
