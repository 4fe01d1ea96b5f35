"""The plans' counters in Redis, shared by every ingress replica: one round trip per step."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from redis.asyncio import BlockingConnectionPool, Redis

from app.limits.windows import LEASE_TTL_S, Ask, CounterKeys, Lease, Snapshot

# Redis connections per ingress replica; each step holds one for a round trip.
REDIS_CONNECTIONS = 64


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
            pipe.incrby(name, requests)
            pipe.expire(name, keys.requests.get_expiry(), nx=True)
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
                pipe.zadd(name, {lease: expiry}, xx=True)
                pipe.expire(name, math.ceil(self.ttl_s) + 1)
            await pipe.execute()

    async def in_flight(self, key: str) -> int:
        name = self._key(key)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(name, "-inf", self._clock())
            pipe.zcard(name)
            return int((await pipe.execute())[1])

    async def clear(self) -> None:
        """Delete every key under this prefix."""
        async for name in self._redis.scan_iter(match=self._prefix + "*", count=1000):
            await self._redis.delete(name)

    async def close(self) -> None:
        await self._redis.aclose()
