"""Where the plans' counters live: one interface, in process memory or in Redis.

A request's counters are fixed windows (a minute of requests, a minute of tokens, a UTC day of
tokens; each window starts with its first hit and expires with it) and its concurrency slot,
a lease: a member of a set per user and model type whose score is its expiry. Taking a slot
drops the expired members first, so a count can neither drift past the leases that are alive
nor go below zero, whatever order releases arrive in. Admission reads and bumps all of them in
one step (`admit`); a reply's tokens are charged, and its slot freed, in another (`charge`).

`MemoryCounters` holds them for one ingress replica (`limits`' memory storage); `RedisCounters`
for every replica alike, in one MULTI/EXEC round trip per step (redis-py): through `limits`,
one call per counter, the same work took about twice the CPU and latency (bench/NOTES.md).
Expiry times of leases are Unix times of the replica that wrote them (hosts keep time by NTP).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from limits import RateLimitItem
from limits.aio.storage import MemoryStorage
from redis.asyncio import BlockingConnectionPool, Redis

LEASE_TTL_S = 15.0
# Redis connections per ingress replica; each step holds one for a round trip.
REDIS_CONNECTIONS = 64

Lease = tuple[str, str]
"""(the slot set's key, the lease id): one running request's slot."""


@dataclass(frozen=True, slots=True)
class CounterKeys:
    """The windows of one user on one model type, and their keys (`limits`' naming)."""

    requests: RateLimitItem
    tokens: RateLimitItem
    daily: RateLimitItem
    ids: tuple[str, str]
    day: str

    def requests_key(self) -> str:
        return self.requests.key_for(*self.ids, "requests")

    def tokens_key(self) -> str:
        return self.tokens.key_for(*self.ids, "tokens")

    def daily_key(self) -> str:
        return self.daily.key_for(*self.ids, self.day)

    def concurrency_key(self) -> str:
        return f"concurrent/{'/'.join(self.ids)}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The counters right after a request was counted; resets are Unix times."""

    requests: int
    requests_reset: float
    tokens: int
    tokens_reset: float
    daily_tokens: int
    in_flight: int


class Counters(Protocol):
    """The plans' counters and slots, the same operations in memory and in Redis."""

    async def admit(self, keys: CounterKeys, lease: str) -> Snapshot:
        """Count the request, hold its slot (`lease`), read the token windows: one step."""

    async def charge(self, keys: CounterKeys, lease: str, tokens: int) -> None:
        """Add the tokens a reply used to its windows (past the limit too); free its slot."""

    async def count_request(self, keys: CounterKeys) -> None:
        """Count a request refused before admission (an invalid body) in its window."""

    async def requests_used(self, keys: CounterKeys) -> int:
        """Requests counted in the current minute, read without counting."""

    async def release(self, key: str, lease: str) -> None:
        """Give a slot back (again is fine)."""

    async def renew(self, leases: Iterable[Lease]) -> None:
        """Push the expiry of live leases forward (a released or lapsed one stays gone)."""

    async def in_flight(self, key: str) -> int:
        """Live leases of a slot set."""

    async def clear(self) -> None:
        """Forget every counter (tests)."""

    async def close(self) -> None: ...


class MemoryCounters:
    """The counters of one replica's process: `limits`' memory storage, and leases in a dict."""

    def __init__(self, ttl_s: float = LEASE_TTL_S, clock: Callable[[], float] = time.time):
        self.ttl_s = ttl_s
        self._clock = clock
        self._windows = MemoryStorage()
        self._held: dict[str, dict[str, float]] = {}

    async def admit(self, keys: CounterKeys, lease: str) -> Snapshot:
        windows = self._windows
        requests = await windows.incr(keys.requests_key(), keys.requests.get_expiry())
        return Snapshot(
            requests=requests,
            requests_reset=await windows.get_expiry(keys.requests_key()),
            tokens=await windows.get(keys.tokens_key()),
            tokens_reset=await windows.get_expiry(keys.tokens_key()),
            daily_tokens=await windows.get(keys.daily_key()),
            in_flight=self._take(keys.concurrency_key(), lease),
        )

    async def charge(self, keys: CounterKeys, lease: str, tokens: int) -> None:
        if tokens > 0:
            await self._windows.incr(keys.tokens_key(), keys.tokens.get_expiry(), tokens)
            await self._windows.incr(keys.daily_key(), keys.daily.get_expiry(), tokens)
        await self.release(keys.concurrency_key(), lease)

    async def count_request(self, keys: CounterKeys) -> None:
        await self._windows.incr(keys.requests_key(), keys.requests.get_expiry())

    async def requests_used(self, keys: CounterKeys) -> int:
        return await self._windows.get(keys.requests_key())

    def _live(self, key: str) -> dict[str, float]:
        leases = self._held.get(key, {})
        now = self._clock()
        for lease in [lease for lease, expiry in leases.items() if expiry <= now]:
            del leases[lease]
        return leases

    def _take(self, key: str, lease: str) -> int:
        leases = self._live(key)
        leases[lease] = self._clock() + self.ttl_s
        self._held[key] = leases
        return len(leases)

    async def release(self, key: str, lease: str) -> None:
        leases = self._held.get(key)
        if leases is not None:
            leases.pop(lease, None)
            if not leases:
                del self._held[key]

    async def renew(self, leases: Iterable[Lease]) -> None:
        expiry = self._clock() + self.ttl_s
        for key, lease in leases:
            held = self._live(key)
            if lease in held:
                held[lease] = expiry

    async def in_flight(self, key: str) -> int:
        return len(self._live(key))

    async def clear(self) -> None:
        await self._windows.reset()
        self._held.clear()

    async def close(self) -> None:
        pass


class RedisCounters:
    """The counters of every replica, in Redis under `key_prefix`.

    Windows are the same operations on the same keys as `limits`' Redis storage (INCRBY, then
    EXPIRE NX: the window starts with its first hit), batched: one MULTI/EXEC per step.
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "serviceai",
        timeout_s: float = 2.0,
        ttl_s: float = LEASE_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # Bounded (a burst queues for a connection rather than opening hundreds); every wait,
        # connect and reply gives up after `timeout_s`.
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=REDIS_CONNECTIONS,
            timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
        )
        self._redis = Redis(connection_pool=pool)
        self._prefix = f"{key_prefix}:"
        self.ttl_s = ttl_s
        self._clock = clock

    def _key(self, key: str) -> str:
        return self._prefix + key

    async def admit(self, keys: CounterKeys, lease: str) -> Snapshot:
        requests = self._key(keys.requests_key())
        tokens, daily = self._key(keys.tokens_key()), self._key(keys.daily_key())
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incrby(requests, 1).expire(requests, keys.requests.get_expiry(), nx=True)
            pipe.ttl(requests).get(tokens).ttl(tokens).get(daily)
            self._queue_take(pipe, keys.concurrency_key(), lease)
            count, _, requests_ttl, used, tokens_ttl, used_today, *rest = await pipe.execute()
        now = time.time()
        return Snapshot(
            requests=int(count),
            requests_reset=now + max(int(requests_ttl), 0),
            tokens=int(used or 0),
            tokens_reset=now + max(int(tokens_ttl), 0),
            daily_tokens=int(used_today or 0),
            in_flight=int(rest[2]),
        )

    def _queue_take(self, pipe: Redis, key: str, lease: str) -> None:
        """The commands of taking a slot; the count is the third of their results."""
        name, now = self._key(key), self._clock()
        pipe.zremrangebyscore(name, "-inf", now).zadd(name, {lease: now + self.ttl_s})
        pipe.zcard(name).expire(name, math.ceil(self.ttl_s) + 1)

    async def charge(self, keys: CounterKeys, lease: str, tokens: int) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            if tokens > 0:
                for item, name in ((keys.tokens, self._key(keys.tokens_key())),
                                   (keys.daily, self._key(keys.daily_key()))):
                    pipe.incrby(name, tokens).expire(name, item.get_expiry(), nx=True)
            pipe.zrem(self._key(keys.concurrency_key()), lease)
            await pipe.execute()

    async def count_request(self, keys: CounterKeys) -> None:
        name = self._key(keys.requests_key())
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incrby(name, 1).expire(name, keys.requests.get_expiry(), nx=True)
            await pipe.execute()

    async def requests_used(self, keys: CounterKeys) -> int:
        return int(await self._redis.get(self._key(keys.requests_key())) or 0)

    async def release(self, key: str, lease: str) -> None:
        await self._redis.zrem(self._key(key), lease)

    async def renew(self, leases: Iterable[Lease]) -> None:
        leases = list(leases)
        if not leases:
            return
        expiry = self._clock() + self.ttl_s
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, lease in leases:
                name = self._key(key)
                pipe.zadd(name, {lease: expiry}, xx=True).expire(name, math.ceil(self.ttl_s) + 1)
            await pipe.execute()

    async def in_flight(self, key: str) -> int:
        name = self._key(key)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(name, "-inf", self._clock()).zcard(name)
            return int((await pipe.execute())[1])

    async def clear(self) -> None:
        """Delete every key under this prefix."""
        async for name in self._redis.scan_iter(match=self._prefix + "*", count=1000):
            await self._redis.delete(name)

    async def close(self) -> None:
        await self._redis.aclose()


def open_counters(
    redis_url: str | None, *, key_prefix: str = "serviceai", timeout_s: float = 2.0
) -> Counters:
    """Process memory without a URL; Redis with one (shared by every ingress replica)."""
    if redis_url is None:
        return MemoryCounters()
    return RedisCounters(redis_url, key_prefix=key_prefix, timeout_s=timeout_s)
