"""A request's rate-limit counters, and the one storage round trip that admission makes.

The counters are `limits`' fixed windows (`RateLimitItem.key_for` names them): a counter per
window that starts with its first hit and expires with it. In memory, `limits`' storage and its
`FixedWindowRateLimiter` (weighted hits for tokens) do the work. In Redis the same operations on
the same keys (INCRBY, then EXPIRE NX, as `limits`' own incr script) go out as one MULTI/EXEC
pipeline per request and one per reply: through `limits`, one call per counter, the same work
took about twice the CPU and latency (bench/NOTES.md). The concurrency slot is a lease
(`app.slots`), taken in the same round trip.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from limits import RateLimitItem
from limits.aio.storage import RedisStorage, Storage
from limits.aio.strategies import FixedWindowRateLimiter

from app.slots import RedisSlots, Slots


@dataclass(frozen=True, slots=True)
class Counters:
    """The windows of one user on one model type, and their storage keys."""

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
    """The counters right after this request was counted; resets are Unix times."""

    requests: int
    requests_reset: float
    tokens: int
    tokens_reset: float
    daily_tokens: int
    in_flight: int


async def snapshot(storage: Storage, slots: Slots, counters: Counters, lease: str) -> Snapshot:
    """Count the request and take a concurrency slot (`lease`); read the token counters."""
    if isinstance(slots, RedisSlots):
        return await _redis_snapshot(slots, counters, lease)
    requests = await storage.incr(counters.requests_key(), counters.requests.get_expiry())
    in_flight = await slots.take(counters.concurrency_key(), lease)
    return Snapshot(
        requests=requests,
        requests_reset=await storage.get_expiry(counters.requests_key()),
        tokens=await storage.get(counters.tokens_key()),
        tokens_reset=await storage.get_expiry(counters.tokens_key()),
        daily_tokens=await storage.get(counters.daily_key()),
        in_flight=in_flight,
    )


async def _redis_snapshot(slots: RedisSlots, counters: Counters, lease: str) -> Snapshot:
    # INCRBY then EXPIRE NX is what limits' incr script does: the window starts with its first hit.
    storage = slots.storage
    key = storage.bridge.prefixed_key
    requests = key(counters.requests_key())
    tokens, daily = key(counters.tokens_key()), key(counters.daily_key())
    async with storage.bridge.get_connection().pipeline(transaction=True) as pipe:
        pipe.incrby(requests, 1).expire(requests, counters.requests.get_expiry(), nx=True)
        pipe.ttl(requests).get(tokens).ttl(tokens).get(daily)
        offset = slots.queue_take(pipe, counters.concurrency_key(), lease)
        replies = await pipe.execute()
    count, _, requests_ttl, used, tokens_ttl, used_today = replies[:6]
    in_flight = replies[6 + offset]
    now = time.time()
    return Snapshot(
        requests=int(count),
        requests_reset=now + max(int(requests_ttl), 0),
        tokens=int(used or 0),
        tokens_reset=now + max(int(tokens_ttl), 0),
        daily_tokens=int(used_today or 0),
        in_flight=int(in_flight),
    )


async def charge(
    storage: Storage, slots: Slots, counters: Counters, lease: str, tokens: int
) -> None:
    """Add the tokens a reply used to its windows (past the limit too) and free its slot."""
    if isinstance(slots, RedisSlots):
        await _redis_charge(slots.storage, counters, lease, tokens)
        return
    limiter = FixedWindowRateLimiter(storage)
    try:
        if tokens > 0:
            await limiter.hit(counters.tokens, *counters.ids, "tokens", cost=tokens)
            await limiter.hit(counters.daily, *counters.ids, counters.day, cost=tokens)
    finally:
        await slots.release(counters.concurrency_key(), lease)


async def count_request(storage: Storage, counters: Counters) -> None:
    """Count a request that was refused before admission (an invalid body) in its window."""
    await storage.incr(counters.requests_key(), counters.requests.get_expiry())


async def _redis_charge(
    storage: RedisStorage, counters: Counters, lease: str, tokens: int
) -> None:
    key = storage.bridge.prefixed_key
    async with storage.bridge.get_connection().pipeline(transaction=True) as pipe:
        if tokens > 0:
            for item, name in ((counters.tokens, key(counters.tokens_key())),
                               (counters.daily, key(counters.daily_key()))):
                pipe.incrby(name, tokens).expire(name, item.get_expiry(), nx=True)
        pipe.zrem(key(counters.concurrency_key()), lease)
        await pipe.execute()
