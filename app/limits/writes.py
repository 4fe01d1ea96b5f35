"""Counter writes off the response path: replies' settlements, and refused bodies batched.

A reply's settlement is written in the background (the response waits for it at most a
second, `app.limits.ticket.settled`). Bodies refused before admission count against the
caller's request rate; a burst of them is one INCRBY per window per round trip, however many
come while one is written. A failed write is logged, never raised: the limits fail open.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from app.limits.counters import CounterKeys, Counters

logger = logging.getLogger("ray.serve.serviceai")


class CounterWrites:
    """The writes to the counters still running, kept until they finish."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._running: set[asyncio.Task[None]] = set()
        # Refused bodies not yet written, by request window.
        self._refused: dict[str, tuple[CounterKeys, int]] = {}
        self._refused_round: asyncio.Future[None] | None = None  # done when those are written
        self._writing_refused = False

    def start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a write off the response path; keep a reference until it finishes."""
        task = asyncio.get_running_loop().create_task(_logged(work))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    def count_refused(self, windows: list[CounterKeys]) -> asyncio.Future[None]:
        """Count one refused body in each of `windows`; done when the write that takes it
        along has ended."""
        for keys in windows:
            window = keys.requests_key()
            self._refused[window] = (keys, self._refused.get(window, (keys, 0))[1] + 1)
        if self._refused_round is None:
            self._refused_round = asyncio.get_running_loop().create_future()
        counted = self._refused_round
        if not self._writing_refused:
            self._writing_refused = True
            self.start(self._write_refused())
        return counted

    async def _write_refused(self) -> None:
        """Write the refused bodies counted so far, and those counted while writing, until none
        are left."""
        try:
            while self._refused:
                counted, self._refused = self._refused, {}
                written, self._refused_round = self._refused_round, None
                try:
                    await asyncio.gather(
                        *(
                            _logged(self.counters.count_request(keys, n))
                            for keys, n in counted.values()
                        )
                    )
                finally:
                    if written is not None and not written.done():
                        written.set_result(None)
        finally:
            self._writing_refused = False

    @property
    def running(self) -> set[asyncio.Task[None]]:
        return self._running

    async def written(self) -> None:
        """Wait for the writes still running."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


async def _logged(work: Coroutine[Any, Any, None]) -> None:
    try:
        await work
    except Exception as exc:
        logger.warning("Rate-limit storage write failed: %s", type(exc).__name__)
