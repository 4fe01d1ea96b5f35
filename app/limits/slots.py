"""Concurrency slots as leases: taken at admission, renewed while the request runs, released
once at its end, and gone within `LEASE_TTL_S` of their replica dying.

The leases live with the other counters (app.limits.counters). Each ingress replica renews the
leases of its running requests every `RENEW_EVERY_S`, in one round trip (`LeaseKeeper`); a
replica that dies stops renewing, and its leases lapse.
"""

from __future__ import annotations

import logging

from app.limits.counters import Counters
from app.periodic import PeriodicFlush

logger = logging.getLogger("ray.serve.serviceai")

RENEW_EVERY_S = 5.0


class LeaseKeeper:
    """The leases of this replica's running requests, renewed every `every_s` in one call."""

    def __init__(self, counters: Counters, every_s: float = RENEW_EVERY_S) -> None:
        self.counters = counters
        self._held: dict[str, str] = {}
        self._renewal = PeriodicFlush(self.renew, every_s, "concurrency leases")
        self._started = False

    def hold(self, key: str, lease: str) -> None:
        if not self._started:  # on the first request: the replica's event loop runs by then
            self._started = True
            self._renewal.start()
        self._held[lease] = key

    def drop(self, lease: str) -> None:
        self._held.pop(lease, None)

    async def renew(self) -> None:
        try:
            await self.counters.renew((key, lease) for lease, key in list(self._held.items()))
        except Exception as exc:  # storage down: the leases lapse, as they would for a dead replica
            logger.warning("Renewing concurrency leases failed: %s", type(exc).__name__)

    async def close(self) -> None:
        if self._started:
            await self._renewal.stop()
            self._started = False
