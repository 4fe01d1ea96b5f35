"""A gang's members meeting over one engine (deployments.serving_processes), without Ray: the
meeting is the real class's logic behind a stand-in for its actor handle; the e2e test runs the
gang for real (tests/e2e/test_serving_processes.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from deployments import serving_processes
from deployments.serving_processes import Gang, GangRefused


class Handle:
    """An actor handle over a local object: `handle.method.remote(...)` awaits the method."""

    def __init__(self, target: object) -> None:
        self._target = target

    def __getattr__(self, name: str) -> SimpleNamespace:
        method = getattr(self._target, name)

        async def call(*args):
            return method(*args)

        return SimpleNamespace(remote=lambda *args: asyncio.ensure_future(call(*args)))


@pytest.fixture
def meetings(monkeypatch):
    """Meetings by gang id, created as `Meeting.options(name=..., get_if_exists=True)` would."""
    found: dict[str, Handle] = {}
    meeting_class = serving_processes.Meeting.__ray_metadata__.modified_class

    def options(name: str, **_):
        def remote(size: int) -> Handle:
            return found.setdefault(name, Handle(meeting_class(size)))

        return SimpleNamespace(remote=remote)

    monkeypatch.setattr(serving_processes.Meeting, "options", options)
    monkeypatch.setattr(
        serving_processes.ray,
        "get_runtime_context",
        lambda: SimpleNamespace(get_node_id=lambda: "node-a"),
    )
    monkeypatch.setattr(serving_processes, "MEET_POLL_S", 0.01)
    # The members' guard would end this process: the core (4242) is not a real process here.
    monkeypatch.setattr(serving_processes, "_end_if_gone", lambda pids, started: None)
    return found


class Engine:
    """What a member's `start_engine` returns: the options it was started with."""

    def __init__(self, **options) -> None:
        self.options = options
        self.watched: tuple[int, ...] | None = None
        others = options.get("start_others")
        if others is not None:
            others([f"client {i}" for i in range(1, options["serving_processes"])])

    def core_pids(self) -> tuple[int, ...]:
        return (4242,) if "start_others" in self.options else ()

    def watch_core(self, pids: tuple[int, ...]) -> None:
        self.watched = pids


async def start_engine(**options) -> Engine:
    return Engine(**options)


def gang(rank: int, size: int = 3) -> Gang:
    return Gang(SimpleNamespace(gang_id="g1", rank=rank, world_size=size))


async def test_rank_0_launches_the_core_and_each_member_connects_as_its_client(meetings):
    members = [gang(rank) for rank in range(3)]
    engines = await asyncio.gather(*(m.start(start_engine) for m in reversed(members)))
    first, second, third = reversed(engines)
    assert first.options["serving_processes"] == 3
    assert second.options == {"client": "client 1"}
    assert third.options == {"client": "client 2"}
    # The others watch the core rank 0 launched, and every member knows the gang's pids.
    assert (second.watched, third.watched) == ((4242,), (4242,))
    assert first.watched is None
    assert all(m.core == (4242,) for m in members)
    assert all(len(m.others()) == 2 for m in members)


async def test_a_member_connects_only_once_the_core_is_up(meetings):
    # Rank 1 alone: it registers and waits; it has not connected while rank 0 has not launched.
    second = asyncio.ensure_future(gang(1, size=2).start(start_engine))
    await asyncio.sleep(0.1)
    assert not second.done()
    first = await gang(0, size=2).start(start_engine)
    assert (await second).options == {"client": "client 1"}
    assert first.core_pids() == (4242,)


def test_a_starting_member_ends_itself_when_the_core_it_waits_for_ends(monkeypatch):
    ended = threading.Event()
    monkeypatch.setattr(serving_processes.os, "_exit", lambda code: ended.set())
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    started = threading.Event()
    serving_processes._end_if_gone([core.pid], started)
    core.wait()
    assert ended.wait(10)
    # Once started, the core's end is watch_core's to handle: the guard stays quiet.
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    quiet = threading.Event()
    monkeypatch.setattr(serving_processes.os, "_exit", lambda code: quiet.set())
    done = threading.Event()
    serving_processes._end_if_gone([core.pid], done)
    done.set()
    core.wait()
    assert not quiet.wait(0.5)


async def test_a_gang_split_over_two_gpus_is_refused_by_every_member(meetings, monkeypatch):
    devices = iter(["0", "1"])

    async def start(member: Gang):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", next(devices))  # read before the first await
        return await member.start(start_engine)

    results = await asyncio.gather(
        start(gang(0, size=2)), start(gang(1, size=2)), return_exceptions=True
    )
    assert all(isinstance(r, GangRefused) for r in results), results
    assert "another node or GPU" in str(results[0])


def test_rank_0_outlives_the_other_members_until_they_end(meetings):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    first = gang(0, size=2)
    first.members = [
        serving_processes.Member(0, os.getpid(), "n", None),
        serving_processes.Member(1, other.pid, "n", None),
    ]
    started = time.monotonic()
    first.outlive_others(timeout_s=10)
    other.wait()
    assert 0.3 < time.monotonic() - started < 5
    # A member stops without waiting: only rank 0 holds the core.
    second = gang(1, size=2)
    second.members = first.members
    started = time.monotonic()
    second.outlive_others(timeout_s=10)
    assert time.monotonic() - started < 0.1
