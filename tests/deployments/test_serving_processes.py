"""The replica's side of its serving processes, without Ray actors: where a request goes, and
what a serving process's call that ends, fails or is left becomes (the e2e test runs them)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest
from ray.exceptions import RayActorError, RayTaskError

from deployments import serving_processes
from deployments.serving_processes import ServingProcesses
from deployments.wire import EngineUnavailable, InvalidGenerationRequest, ReplyPart


def processes(count: int) -> ServingProcesses:
    spread = ServingProcesses(config=None, model="m", replica="r")
    spread.actors = [object()] * (count - 1)
    spread._load = [0] * count
    spread.served = [0] * count
    return spread


async def parts(*items):
    """A serving process's streaming call as the replica reads it: awaitables, in order."""
    for item in items:
        future = asyncio.get_running_loop().create_future()
        if isinstance(item, BaseException):
            future.set_exception(item)
        else:
            future.set_result(item)
        yield future


async def test_each_request_goes_to_the_least_busy_process_the_replica_included(monkeypatch):
    # Below SPREAD_FROM requests the replica serves alone (no feed would carry a serving
    # process's stream past it); from there on, the least busy.
    monkeypatch.setattr(serving_processes, "SPREAD_FROM", 1)
    spread = processes(3)

    async def hold(index: int, release: asyncio.Event):
        async def forever():
            await release.wait()
            yield ReplyPart(b"", 1, 1, last=True)

        source = spread.own(forever()) if index == 0 else spread._relay(index, parts())
        async with aclosing(source) as running:
            async for _ in running:
                pass

    release = asyncio.Event()
    first = spread.pick()
    assert first == 0
    task = asyncio.ensure_future(hold(first, release))
    await asyncio.sleep(0)
    assert spread._load == [1, 0, 0]
    assert spread.pick() == 1  # the replica is busy: the next goes to a serving process
    release.set()
    await task
    assert spread._load == [0, 0, 0]
    assert spread.served == [1, 1, 0]


async def test_a_refusal_in_a_serving_process_is_raised_as_the_replica_would_raise_it():
    spread = processes(2)
    refusal = InvalidGenerationRequest("bad schema")
    refusal.param = "response_format"
    wrapped = RayTaskError("stream", "traceback", refusal)
    with pytest.raises(InvalidGenerationRequest) as raised:
        async for _ in spread._relay(1, parts(wrapped)):
            pass
    assert raised.value.param == "response_format" and raised.value.status == 400


async def test_a_dead_serving_process_fails_its_requests_and_takes_no_more(monkeypatch):
    monkeypatch.setattr(serving_processes, "SPREAD_FROM", 0)
    spread = processes(2)
    spread._load[0] = 5  # the replica is busier: process 1 would be picked
    with pytest.raises(EngineUnavailable):
        async for _ in spread._relay(1, parts(ReplyPart(b"x", 1, 1), RayActorError())):
            pass
    assert spread.pick() == 0
    with pytest.raises(RuntimeError, match="serving process"):
        await spread.check_health()


async def test_a_call_the_client_left_is_cancelled_in_its_serving_process(monkeypatch):
    cancelled = []
    monkeypatch.setattr(serving_processes.ray, "cancel", cancelled.append)
    spread = processes(2)
    call = parts(ReplyPart(b"a", 1, 1), ReplyPart(b"b", 1, 2))
    async with aclosing(spread._relay(1, call)) as relayed:
        assert (await anext(relayed)).data == b"a"
    assert cancelled == [call]
    assert spread._load == [0, 0]


def test_the_replica_serves_alone_below_the_feeds_threshold(monkeypatch):
    monkeypatch.setattr(serving_processes, "SPREAD_FROM", 16)
    spread = processes(4)
    spread._load = [15, 0, 0, 0]
    assert spread.pick() == 0
    spread._load[0] = 16
    assert spread.pick() == 1
