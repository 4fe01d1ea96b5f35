"""Concurrency slots as leases: taken at admission, renewed while the request runs, released
once at its end, and gone within `LEASE_TTL_S` of their replica dying.

A slot is a member of a set per user and model type (a Redis sorted set, or a dict in memory)
whose score is its expiry. Taking one first drops the expired members, so a count can neither
drift past the leases that are alive nor go below zero, whatever order releases arrive in.
Each ingress replica renews the leases of its running requests every `RENEW_EVERY_S`, in one
round trip (`LeaseKeeper`); a replica that dies stops renewing, and its leases lapse.
Expiry times are Unix times of the replica that wrote them (hosts keep time with NTP).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from limits.aio.storage import RedisStorage, Storage

from app.periodic import PeriodicFlush

logger = logging.getLogger("ray.serve.serviceai")

LEASE_TTL_S = 15.0
RENEW_EVERY_S = 5.0

Lease = tuple[str, str]
"""(the slot set's key, the lease id): one running request's slot."""


class Slots(Protocol):
    """Where leases live; the same operations in process memory and in Redis."""

    async def take(self, key: str, lease: str) -> int:
        """Hold a slot; how many live leases the key holds now, this one included."""

    async def renew(self, leases: Iterable[Lease]) -> None:
        """Push the expiry of live leases forward (a released or lapsed one stays gone)."""

    async def release(self, key: str, lease: str) -> None:
        """Give a slot back (again is fine)."""

    async def count(self, key: str) -> int:
        """Live leases of a key."""


class MemorySlots:
    """The leases of one replica's process."""

    def __init__(self, ttl_s: float = LEASE_TTL_S, clock: Callable[[], float] = time.time):
        self.ttl_s = ttl_s
        self._clock = clock
        self._held: dict[str, dict[str, float]] = {}

    def _live(self, key: str) -> dict[str, float]:
        leases = self._held.get(key, {})
        now = self._clock()
        for lease in [lease for lease, expiry in leases.items() if expiry <= now]:
            del leases[lease]
        return leases

    async def take(self, key: str, lease: str) -> int:
        leases = self._live(key)
        leases[lease] = self._clock() + self.ttl_s
        self._held[key] = leases
        return len(leases)

    async def renew(self, leases: Iterable[Lease]) -> None:
        expiry = self._clock() + self.ttl_s
        for key, lease in leases:
            held = self._live(key)
            if lease in held:
                held[lease] = expiry

    async def release(self, key: str, lease: str) -> None:
        leases = self._held.get(key)
        if leases is not None:
            leases.pop(lease, None)
            if not leases:
                del self._held[key]

    async def count(self, key: str) -> int:
        return len(self._live(key))


class RedisSlots:
    """The leases of every replica, in the Redis of the rate limits (same key prefix)."""

    def __init__(
        self, storage: RedisStorage, ttl_s: float = LEASE_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage = storage
        self.ttl_s = ttl_s
        self._clock = clock

    def queue_take(self, pipe: Any, key: str, lease: str) -> int:
        """Add the commands of `take` to a MULTI pipeline; the count is the result at the
        returned offset (from the first of them)."""
        name = self.storage.bridge.prefixed_key(key)
        now = self._clock()
        pipe.zremrangebyscore(name, "-inf", now).zadd(name, {lease: now + self.ttl_s})
        pipe.zcard(name).expire(name, math.ceil(self.ttl_s) + 1)
        return 2

    async def take(self, key: str, lease: str) -> int:
        async with self.storage.bridge.get_connection().pipeline(transaction=True) as pipe:
            offset = self.queue_take(pipe, key, lease)
            return int((await pipe.execute())[offset])

    async def renew(self, leases: Iterable[Lease]) -> None:
        leases = list(leases)
        if not leases:
            return
        expiry = self._clock() + self.ttl_s
        async with self.storage.bridge.get_connection().pipeline(transaction=False) as pipe:
            for key, lease in leases:
                name = self.storage.bridge.prefixed_key(key)
                pipe.zadd(name, {lease: expiry}, xx=True).expire(name, math.ceil(self.ttl_s) + 1)
            await pipe.execute()

    async def release(self, key: str, lease: str) -> None:
        await self.storage.bridge.get_connection().zrem(
            self.storage.bridge.prefixed_key(key), lease
        )

    async def count(self, key: str) -> int:
        name = self.storage.bridge.prefixed_key(key)
        async with self.storage.bridge.get_connection().pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(name, "-inf", self._clock()).zcard(name)
            return int((await pipe.execute())[1])


def slots_for(storage: Storage, ttl_s: float = LEASE_TTL_S) -> MemorySlots | RedisSlots:
    """Leases beside the rate-limit counters: in Redis when they are, else in memory."""
    if isinstance(storage, RedisStorage):
        return RedisSlots(storage, ttl_s)
    return MemorySlots(ttl_s)


class LeaseKeeper:
    """The leases of this replica's running requests, renewed every `every_s` in one call."""

    def __init__(self, slots: Slots, every_s: float = RENEW_EVERY_S) -> None:
        self.slots = slots
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
            await self.slots.renew((key, lease) for lease, key in list(self._held.items()))
        except Exception as exc:  # storage down: the leases lapse, as they would for a dead replica
            logger.warning("Renewing concurrency leases failed: %s", type(exc).__name__)

    async def close(self) -> None:
        if self._started:
            await self._renewal.stop()
            self._started = False
