"""The engine's slots in plan order, the last ones kept for the first plan."""

from __future__ import annotations

import asyncio

from deployments.priority_gate import PriorityGate
from deployments.vllm_engine.engine import sequences


async def hold(
    gate: PriorityGate,
    priority: int,
    started: list[int],
    release: asyncio.Event,
    size: int = 1,
    running: list[int] | None = None,
) -> None:
    async with gate.slot(priority, size):
        started.append(priority)
        if running is not None:
            running.append(gate.running)  # the slots held once this one started
        await release.wait()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_low_priorities_leave_the_reserved_slots_free():
    gate = PriorityGate(slots=4, reserved=1)
    started: list[int] = []
    release = asyncio.Event()
    flood = [asyncio.ensure_future(hold(gate, 10, started, release)) for _ in range(6)]
    await settle()
    assert started == [10, 10, 10] and gate.waiting == 3
    first = asyncio.ensure_future(hold(gate, 0, started, release))
    await settle()
    assert started == [10, 10, 10, 0]  # the reserved slot, at once
    release.set()
    await asyncio.gather(*flood, first)
    assert started.count(10) == 6 and gate.running == 0


async def test_waiting_requests_start_in_priority_then_arrival_order():
    gate = PriorityGate(slots=1, reserved=0)
    started: list[int] = []
    releases = [asyncio.Event() for _ in range(5)]

    async def one(priority: int, release: asyncio.Event) -> None:
        async with gate.slot(priority):
            started.append(priority)
            await release.wait()

    tasks = [asyncio.ensure_future(one(p, r)) for p, r in zip([5, 9, 1, 5, 0], releases)]
    await settle()
    assert started == [5]
    for index in (0, 4, 2, 3, 1):  # release each as it holds the slot
        releases[index].set()
        await settle()
    await asyncio.gather(*tasks)
    assert started == [5, 0, 1, 5, 9]


async def test_a_request_that_leaves_while_waiting_gives_nothing_up():
    gate = PriorityGate(slots=1, reserved=0)
    started: list[int] = []
    release = asyncio.Event()
    running = asyncio.ensure_future(hold(gate, 1, started, release))
    await settle()
    leaving = asyncio.ensure_future(hold(gate, 0, started, release))
    after = asyncio.ensure_future(hold(gate, 2, started, release))
    await settle()
    leaving.cancel()
    await settle()
    release.set()
    await asyncio.gather(running, after)
    assert started == [1, 2] and gate.running == 0 and gate.waiting == 0


async def test_later_plans_stream_in_larger_chunks_only_while_they_fill_their_slots():
    gate = PriorityGate(slots=4, reserved=1, busy_stream_interval=8)
    started: list[int] = []
    release = asyncio.Event()
    first = [asyncio.ensure_future(hold(gate, 10, started, release)) for _ in range(2)]
    await settle()
    assert gate.stream_interval(10) == 1  # a slot of theirs is still free
    first.append(asyncio.ensure_future(hold(gate, 10, started, release)))
    await settle()
    assert gate.stream_interval(10) == 8
    assert gate.stream_interval(0) == 1  # the first plan streams token by token always
    release.set()
    await asyncio.gather(*first)
    assert gate.stream_interval(10) == 1


async def test_a_request_takes_a_slot_per_sequence_and_the_reserve_holds():
    """Requests of several choices fill the engine as many requests would: the reserve holds."""
    gate = PriorityGate(slots=8, reserved=1)
    started: list[int] = []
    release = asyncio.Event()
    flood = [asyncio.ensure_future(hold(gate, 10, started, release, size=4)) for _ in range(3)]
    await settle()
    assert started == [10] and gate.running == 4 and gate.waiting == 2  # 4 + 4 > 7
    first = asyncio.ensure_future(hold(gate, 0, started, release, size=2))
    await settle()
    assert started == [10, 0] and gate.running == 6  # the reserve and one free slot
    running: list[int] = []
    huge = asyncio.ensure_future(hold(gate, 10, started, release, size=64, running=running))
    release.set()
    await asyncio.gather(*flood, first, huge)
    assert started == [10, 0, 10, 10, 10] and gate.running == 0 and gate.waiting == 0
    assert running == [8]  # larger than its plan's slots: it ran alone, on all of them


async def test_a_request_that_leaves_first_in_line_lets_those_behind_it_start():
    gate = PriorityGate(slots=4, reserved=0)
    started: list[int] = []
    release = asyncio.Event()
    holding = asyncio.ensure_future(hold(gate, 1, started, release, size=2))
    await settle()
    large = asyncio.ensure_future(hold(gate, 1, started, release, size=4))
    small = asyncio.ensure_future(hold(gate, 1, started, release))
    await settle()
    assert started == [1] and gate.waiting == 2  # the small one waits behind the large one
    large.cancel()
    await settle()
    assert started == [1, 1] and gate.running == 3  # with nothing released
    release.set()
    await asyncio.gather(holding, small)
    assert gate.running == 0 and gate.waiting == 0


async def test_a_request_granted_its_slots_as_it_leaves_hands_them_on():
    gate = PriorityGate(slots=2, reserved=0)
    started: list[int] = []
    release = asyncio.Event()
    async with gate.slot(1, size=2):
        leaving = asyncio.ensure_future(hold(gate, 1, started, release, size=2))
        after = asyncio.ensure_future(hold(gate, 1, started, release))
        await settle()
    leaving.cancel()  # granted its slots as this block ended, before it could run
    release.set()
    await asyncio.gather(after)
    assert leaving.cancelled() and started == [1] and gate.running == 0 and gate.waiting == 0


def test_a_request_runs_n_sequences_of_each_of_its_prompts():
    assert sequences("chat", {"messages": [], "n": 3}) == 3
    assert sequences("chat", {"messages": []}) == 1
    assert sequences("completion", {"prompt": ["a", "b"], "n": 2}) == 4
    assert sequences("completion", {"prompt": [[1], [2]], "n": 2}) == 4
    assert sequences("completion", {"prompt": [1, 2, 3]}) == 1
    assert sequences("responses", {"input": "x"}) == 1
    assert sequences("embeddings", {"input": ["a", "b", "c"]}) == 3
    assert sequences("embeddings", {"input": [1, 2]}) == 1
