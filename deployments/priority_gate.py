"""The engine's slots in plan order, with a few kept for the first plan.

vLLM's priority scheduling orders its *waiting* queue by priority but never frees a running
slot for a better request: under a flood of low-priority requests, a high-priority one waits
for the soonest of the running ones to finish (measured on vLLM 0.32's own server:
docs/limits.md, "Priority"). So a replica of a type with `scheduling_policy: priority` admits its requests to the
engine itself: at most `slots` (the engine's max_num_seqs) at once, the last `reserved` of them
only for requests of priority `reserved_for` or better, the rest waiting here in (priority,
arrival) order. A request of the first plan then finds a slot free at once, while the
others still get all the other slots. A request takes a slot per sequence the engine runs for
it (`n` choices of each prompt), so that a few requests of many choices cannot fill the
engine past the reserve; one larger than its plan's slots runs alone.

A slot is not all a request needs: every token it streams passes the replica's serving layer,
Ray, the ingress and the proxy, on the CPUs the first plan's requests need too. So a later
plan's request that starts while the later plans fill every slot they may take streams its
tokens `busy_stream_interval` at a time (vLLM's `stream_interval`: the first and the last at
once; the same tokens in fewer chunks). Measured in bench/NOTES.md ("Plans and streaming").
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

BUSY_STREAM_INTERVAL = 8
"""Default tokens per chunk of a later plan's stream on a busy engine (bench/NOTES.md)."""


class PriorityGate:
    """Admits requests of at most `slots` sequences at once; the last `reserved` slots take only
    requests whose priority is `reserved_for` or lower (lower is first, as in vLLM)."""

    def __init__(
        self, slots: int, reserved: int, reserved_for: int = 0, busy_stream_interval: int = 1
    ) -> None:
        self.slots = slots
        self.reserved = min(reserved, slots - 1)
        self.reserved_for = reserved_for
        self.busy_stream_interval = busy_stream_interval
        self.running = 0
        """Slots held: the engine's sequences admitted and not finished."""
        self._waiting: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def limit(self, priority: int) -> int:
        return self.slots if priority <= self.reserved_for else self.slots - self.reserved

    def stream_interval(self, priority: int) -> int:
        """Tokens per streamed chunk for a request of this priority that holds a slot now."""
        busy = priority > self.reserved_for and self.running >= self.slots - self.reserved
        return self.busy_stream_interval if busy else 1

    @property
    def waiting(self) -> int:
        return sum(1 for *_, future in self._waiting if not future.done())

    @asynccontextmanager
    async def slot(self, priority: int, size: int = 1) -> AsyncIterator[None]:
        """Hold `size` slots (one per sequence the engine runs) for the block; wait for them
        in priority order."""
        size = max(1, min(size, self.slots))
        self._drop_abandoned()
        ahead = self._waiting and self._waiting[0][0] <= priority
        if not ahead and self._fits(priority, size):
            self.running += size
        else:
            future = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (priority, next(self._order), size, future))
            try:
                await future  # the slots are counted for it when they are granted
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._release(size)  # granted as it was cancelled: give them on
                else:
                    future.cancel()
                    self._admit()  # it may have been first in line, the others waiting behind
                raise
        try:
            yield
        finally:
            self._release(size)

    def _fits(self, priority: int, size: int) -> bool:
        """Room for `size` more; one larger than its plan's slots runs alone."""
        return self.running + size <= self.limit(priority) or self.running == 0

    def _release(self, size: int) -> None:
        self.running -= size
        self._admit()

    def _admit(self) -> None:
        """Start those waiting, in order, while the first in line fits."""
        self._drop_abandoned()
        while self._waiting:
            priority, _, size, future = self._waiting[0]
            if not self._fits(priority, size):
                break  # the first in order waits for room; the rest wait behind it
            heapq.heappop(self._waiting)
            self.running += size
            future.set_result(None)
            self._drop_abandoned()

    def _drop_abandoned(self) -> None:
        while self._waiting and self._waiting[0][-1].done():
            heapq.heappop(self._waiting)
