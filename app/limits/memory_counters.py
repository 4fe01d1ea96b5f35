"""The plans' counters in one ingress replica's memory (`limits`' memory storage, leases in a dict)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from limits.aio.storage import MemoryStorage

from app.limits.windows import LEASE_TTL_S, Ask, CounterKeys, Lease, Snapshot, reservation


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
