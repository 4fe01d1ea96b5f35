"""A flush that runs on a timer and once more at shutdown: how replicas batch their writes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger("ray.serve.serviceai")


class PeriodicFlush:
    def __init__(self, flush: Callable[[], Awaitable[None]], every_s: float, what: str) -> None:
        self._flush = flush
        self._every_s = every_s
        self._what = what
        self._task: asyncio.Task[None] | None = None

    def start(self, *, now: bool = False) -> None:
        """Flush every `every_s` (the first one at once with `now`)."""
        self._task = asyncio.get_running_loop().create_task(self._run(now))

    async def _run(self, now: bool = False) -> None:
        while True:
            if not now:
                await asyncio.sleep(self._every_s)
            now = False
            try:
                await self._flush()
            except Exception as exc:  # a bug here must not stop the next rounds
                logger.error("Writing %s failed: %s", self._what, type(exc).__name__)

    async def stop(self) -> None:
        """Stop the timer and write what is left."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        await self._flush()
