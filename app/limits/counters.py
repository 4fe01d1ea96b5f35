"""Where the plans' counters live: one interface, in process memory or in Redis.

A request's counters are fixed windows (a minute of requests, a minute of tokens, a UTC day of
tokens; each window starts with its first hit and expires with it) and its concurrency slot,
a lease: a member of a set per user and model type whose score is its expiry. Taking a slot
drops the expired members first, so a count can neither drift past the leases that are alive
nor go below zero, whatever order releases arrive in.

Admission checks and takes in one step that nothing can interleave with (`admit`: a Lua
script in Redis, a lock in memory): it counts the request, takes its slot, and reserves the
most its reply may generate in the minute's and the day's token windows, so that requests
admitted side by side cannot together pass the plan. Settling (`settle`) replaces the
reservation by the tokens the engine counted, prompt included, and frees the slot; a
reservation whose window has ended by then went with it, and the tokens are charged to the
window of the moment. A refused request reserves nothing and holds no slot.

`MemoryCounters` holds them for one ingress replica (`limits`' memory storage); `RedisCounters`
for every replica alike, in one round trip per step (a script, or MULTI/EXEC; redis-py):
through `limits`, one call per counter, the same work took about twice the CPU and latency
(bench/NOTES.md).
Expiry times of leases are Unix times of the replica that wrote them (hosts keep time by NTP).
"""

from __future__ import annotations

import asyncio
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
class Budget:
    """A token window beside the minute's and the day's (a monthly budget): reserved and
    settled with them."""

    key: str
    limit: int
    expiry_s: int


@dataclass(frozen=True, slots=True)
class CounterKeys:
    """The windows of one user on one model type (or of one key on every type), and their keys
    (`limits`' naming)."""

    requests: RateLimitItem
    tokens: RateLimitItem
    daily: RateLimitItem
    ids: tuple[str, str]
    day: str
    budgets: tuple[Budget, ...] = ()

    def requests_key(self) -> str:
        return self.requests.key_for(*self.ids, "requests")

    def tokens_key(self) -> str:
        return self.tokens.key_for(*self.ids, "tokens")

    def daily_key(self) -> str:
        return self.daily.key_for(*self.ids, self.day)

    def concurrency_key(self) -> str:
        return f"concurrent/{'/'.join(self.ids)}"


@dataclass(frozen=True, slots=True)
class Ask:
    """What a request asks of its plan on one model type, beyond the keys' own limits."""

    concurrent_requests: int
    reply_tokens: int | None
    """The most its reply may generate, all choices (None: what the windows have left)."""
    choices: int = 1
    longest: int | None = None
    """The most one choice can generate (the model's context); None: unbounded."""

    @property
    def needs(self) -> int:
        """Tokens that must be left to admit it: its reply's most, or a token per choice."""
        return self.reply_tokens if self.reply_tokens is not None else self.choices


def reservation(
    keys: CounterKeys,
    ask: Ask,
    requests: int,
    in_flight: int,
    tokens: int,
    daily_tokens: int,
    budgets_used: tuple[int, ...] = (),
) -> int:
    """The completion tokens admission reserves for a request seen with these counts (its own
    request and slot counted), 0 when a limit refuses it. `RESERVE` is this function in Lua;
    `app.limits.admission` words the refusal."""
    left = min(
        max(0, keys.tokens.amount - tokens),
        max(0, keys.daily.amount - daily_tokens),
        *(max(0, budget.limit - used) for budget, used in zip(keys.budgets, budgets_used)),
    )
    if requests > keys.requests.amount or in_flight > ask.concurrent_requests or ask.needs > left:
        return 0
    if ask.reply_tokens is not None:
        return ask.reply_tokens
    each = left // ask.choices
    if ask.longest is not None:
        each = min(each, ask.longest)
    return each * ask.choices


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The counters as admission saw them, the request counted and its slot taken but before
    its reservation; resets are Unix times."""

    requests: int
    requests_reset: float
    tokens: int
    tokens_reset: float
    daily_tokens: int
    in_flight: int
    reserved: int
    """Completion tokens reserved for the request in every token window (0: refused)."""
    budgets_used: tuple[int, ...] = ()
    """Tokens used (and held) in each of the keys' budgets, as seen."""


class Counters(Protocol):
    """The plans' counters and slots, the same operations in memory and in Redis."""

    async def admit(self, keys: CounterKeys, lease: str, ask: Ask) -> Snapshot:
        """Count the request, hold its slot (`lease`), read the token windows and reserve its
        reply in them (`reservation`), all in one step; a refused request keeps no slot."""

    async def settle(
        self, keys: CounterKeys, lease: str, reserved: int, tokens: int, same_window: bool
    ) -> None:
        """Replace a reservation by the tokens the reply used (past the limit too) and free
        its slot. `same_window`: the minute's window the reservation went to is still open
        (else the tokens go to the window of the moment, the reservation having gone)."""

    async def count_request(self, keys: CounterKeys, requests: int = 1) -> None:
        """Count requests refused before admission (invalid bodies) in their window."""

    async def seed(self, key: str, tokens: int, expiry_s: int) -> None:
        """Start a budget's window at `tokens` (what the key store says was used), unless it
        is already counting."""

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
        # `limits`' storage awaits between reads and writes: admissions and settlements take
        # turns, as a script does in Redis.
        self._turn = asyncio.Lock()

    async def admit(self, keys: CounterKeys, lease: str, ask: Ask) -> Snapshot:
        windows = self._windows
        async with self._turn:
            requests = await windows.incr(keys.requests_key(), keys.requests.get_expiry())
            tokens = await windows.get(keys.tokens_key())
            daily_tokens = await windows.get(keys.daily_key())
            budgets_used = tuple([await windows.get(b.key) for b in keys.budgets])
            in_flight = self._take(keys.concurrency_key(), lease)
            reserved = reservation(
                keys, ask, requests, in_flight, tokens, daily_tokens, budgets_used
            )
            if reserved:
                await windows.incr(keys.tokens_key(), keys.tokens.get_expiry(), reserved)
                await windows.incr(keys.daily_key(), keys.daily.get_expiry(), reserved)
                for budget in keys.budgets:
                    await windows.incr(budget.key, budget.expiry_s, reserved)
            else:
                await self.release(keys.concurrency_key(), lease)
            return Snapshot(
                requests=requests,
                requests_reset=await windows.get_expiry(keys.requests_key()),
                tokens=tokens,
                tokens_reset=await windows.get_expiry(keys.tokens_key()),
                daily_tokens=daily_tokens,
                in_flight=in_flight,
                reserved=reserved,
                budgets_used=budgets_used,
            )

    async def settle(
        self, keys: CounterKeys, lease: str, reserved: int, tokens: int, same_window: bool
    ) -> None:
        async with self._turn:
            await self._replace(
                keys.tokens_key(), keys.tokens.get_expiry(), reserved, tokens, same_window
            )
            await self._replace(keys.daily_key(), keys.daily.get_expiry(), reserved, tokens, True)
            for budget in keys.budgets:
                await self._replace(budget.key, budget.expiry_s, reserved, tokens, True)
            await self.release(keys.concurrency_key(), lease)

    async def _replace(
        self, key: str, expiry: int, reserved: int, tokens: int, same_window: bool
    ) -> None:
        windows = self._windows
        if same_window and await windows.get(key) > 0:
            left = await windows.incr(key, expiry, tokens - reserved)
            if left < 0:
                await windows.incr(key, expiry, -left)
        elif tokens > 0:
            await windows.incr(key, expiry, tokens)

    async def seed(self, key: str, tokens: int, expiry_s: int) -> None:
        async with self._turn:
            if await self._windows.get(key) == 0 and tokens > 0:
                await self._windows.incr(key, expiry_s, tokens)

    async def count_request(self, keys: CounterKeys, requests: int = 1) -> None:
        await self._windows.incr(keys.requests_key(), keys.requests.get_expiry(), requests)

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


RESERVE = """
-- KEYS: requests, tokens, daily, slots, then the budgets. ARGV: the three windows' expiries,
-- lease, now, lease ttl, then `reservation`'s limits: requests, tokens, daily, concurrent
-- requests, reply tokens (-1: none), choices, longest (-1: none); then each budget's limit
-- and expiry.
local requests = redis.call('INCRBY', KEYS[1], 1)
redis.call('EXPIRE', KEYS[1], ARGV[1], 'NX')
local now, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
redis.call('ZADD', KEYS[4], now + ttl, ARGV[4])
local in_flight = redis.call('ZCARD', KEYS[4])
redis.call('EXPIRE', KEYS[4], math.ceil(ttl) + 1)
local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
local daily = tonumber(redis.call('GET', KEYS[3]) or '0')
local reply, choices, longest = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local left = math.min(math.max(0, tonumber(ARGV[8]) - tokens),
                      math.max(0, tonumber(ARGV[9]) - daily))
local budgets = {}
for i = 5, #KEYS do
  local used = tonumber(redis.call('GET', KEYS[i]) or '0')
  budgets[#budgets + 1] = used
  left = math.min(left, math.max(0, tonumber(ARGV[14 + 2 * (i - 5)]) - used))
end
local needs = reply
if reply < 0 then needs = choices end
local reserved = 0
if requests <= tonumber(ARGV[7]) and in_flight <= tonumber(ARGV[10]) and needs <= left then
  if reply >= 0 then
    reserved = reply
  else
    local each = math.floor(left / choices)
    if longest >= 0 then each = math.min(each, longest) end
    reserved = each * choices
  end
end
if reserved > 0 then
  redis.call('INCRBY', KEYS[2], reserved)
  redis.call('EXPIRE', KEYS[2], ARGV[2], 'NX')
  redis.call('INCRBY', KEYS[3], reserved)
  redis.call('EXPIRE', KEYS[3], ARGV[3], 'NX')
  for i = 5, #KEYS do
    redis.call('INCRBY', KEYS[i], reserved)
    redis.call('EXPIRE', KEYS[i], ARGV[15 + 2 * (i - 5)], 'NX')
  end
else
  redis.call('ZREM', KEYS[4], ARGV[4])
end
return {requests, redis.call('TTL', KEYS[1]), tokens, redis.call('TTL', KEYS[2]), daily,
        in_flight, reserved, budgets}
"""
"""`reservation` and the windows it reads and writes, in one step no other client interleaves."""

SETTLE = """
-- KEYS: tokens, daily, slots, then the budgets. ARGV: reserved, tokens used, same window
-- (1/0), the two windows' expiries, lease, then each budget's expiry.
local reserved, used = tonumber(ARGV[1]), tonumber(ARGV[2])
local function replace(key, expiry, same_window)
  if same_window and redis.call('EXISTS', key) == 1 then
    if redis.call('INCRBY', key, used - reserved) < 0 then
      redis.call('SET', key, 0, 'KEEPTTL')
    end
  elseif used > 0 then
    redis.call('INCRBY', key, used)
    redis.call('EXPIRE', key, expiry, 'NX')
  end
end
replace(KEYS[1], ARGV[4], ARGV[3] == '1')
replace(KEYS[2], ARGV[5], true)
for i = 4, #KEYS do
  replace(KEYS[i], ARGV[3 + i], true)
end
redis.call('ZREM', KEYS[3], ARGV[6])
"""


class RedisCounters:
    """The counters of every replica, in Redis under `key_prefix`.

    Windows are the same operations on the same keys as `limits`' Redis storage (INCRBY, then
    EXPIRE NX: the window starts with its first hit); a step is one round trip (a script for
    admitting and settling, MULTI/EXEC for the rest).
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
        # Sent by hash (EVALSHA), the script's text only when Redis does not have it yet.
        self._reserve = self._redis.register_script(RESERVE)
        self._settle = self._redis.register_script(SETTLE)

    def _key(self, key: str) -> str:
        return self._prefix + key

    async def admit(self, keys: CounterKeys, lease: str, ask: Ask) -> Snapshot:
        names = [
            self._key(key)
            for key in (
                keys.requests_key(),
                keys.tokens_key(),
                keys.daily_key(),
                keys.concurrency_key(),
            )
        ]
        names += [self._key(budget.key) for budget in keys.budgets]
        unset = -1
        (
            count,
            requests_ttl,
            used,
            tokens_ttl,
            used_today,
            in_flight,
            reserved,
            budgets,
        ) = await self._reserve(
            keys=names,
            args=[
                keys.requests.get_expiry(),
                keys.tokens.get_expiry(),
                keys.daily.get_expiry(),
                lease,
                repr(self._clock()),
                repr(self.ttl_s),
                keys.requests.amount,
                keys.tokens.amount,
                keys.daily.amount,
                ask.concurrent_requests,
                unset if ask.reply_tokens is None else ask.reply_tokens,
                ask.choices,
                unset if ask.longest is None else ask.longest,
                *(value for b in keys.budgets for value in (b.limit, b.expiry_s)),
            ],
        )
        now = time.time()
        return Snapshot(
            requests=int(count),
            requests_reset=now + max(int(requests_ttl), 0),
            tokens=int(used),
            tokens_reset=now + max(int(tokens_ttl), 0),
            daily_tokens=int(used_today),
            in_flight=int(in_flight),
            reserved=int(reserved),
            budgets_used=tuple(int(b) for b in budgets),
        )

    async def settle(
        self, keys: CounterKeys, lease: str, reserved: int, tokens: int, same_window: bool
    ) -> None:
        names = [
            self._key(key) for key in (keys.tokens_key(), keys.daily_key(), keys.concurrency_key())
        ]
        names += [self._key(budget.key) for budget in keys.budgets]
        await self._settle(
            keys=names,
            args=[
                reserved,
                tokens,
                int(same_window),
                keys.tokens.get_expiry(),
                keys.daily.get_expiry(),
                lease,
                *(budget.expiry_s for budget in keys.budgets),
            ],
        )

    async def seed(self, key: str, tokens: int, expiry_s: int) -> None:
        if tokens > 0:
            await self._redis.set(self._key(key), tokens, ex=expiry_s, nx=True)

    async def count_request(self, keys: CounterKeys, requests: int = 1) -> None:
        name = self._key(keys.requests_key())
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incrby(name, requests).expire(name, keys.requests.get_expiry(), nx=True)
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
