"""How long the rate-limit check takes per request, in memory and in Redis.

    .venv/bin/python bench/rate_limits.py                                  # memory, and local Redis
    .venv/bin/python bench/rate_limits.py --redis-url redis://HOST:6379/0

Each sample is one `RateLimits.admit` (what a chat completion waits for before dispatch), timed
alone, for users spread over `--users`; the charge after the reply runs off the request path and
is awaited between samples so that it does not overlap the next one. `--concurrency` admits that
many requests at once and reports admissions per second. Redis keys use a throw-away prefix and
are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import statistics
import time

from app.accounts.auth import Caller
from app.limits.admission import RateLimits
from app.limits.counters import open_counters
from app.limits.plans import Plans

MODEL_TYPE = "ServiceAi-Fast"
HIGH = {
    "requests_per_minute": 10**9,
    "tokens_per_minute": 10**12,
    "concurrent_requests": 10**6,
    "tokens_per_day": 10**15,
}


def report(name: str, samples: list[float]) -> None:
    cuts = statistics.quantiles(samples, n=100)
    print(f"{name:<34} n={len(samples):>6}  p50={cuts[49]:8.1f} us  p99={cuts[98]:8.1f} us")


async def sequential(limits: RateLimits, callers: list[Caller], rounds: int) -> list[float]:
    samples = []
    for i in range(rounds):
        started = time.perf_counter_ns()
        admission = await limits.admit(callers[i % len(callers)], MODEL_TYPE, 16)
        samples.append((time.perf_counter_ns() - started) / 1000)
        admission.settle(20, 16)
        await limits.close()
    return samples


async def concurrent(limits: RateLimits, callers: list[Caller], total: int, at_once: int) -> float:
    """Admissions (and their charges) per second with `at_once` in flight."""

    async def one(i: int) -> None:
        (await limits.admit(callers[i % len(callers)], MODEL_TYPE, 16)).settle(20, 16)

    started = time.perf_counter()
    for first in range(0, total, at_once):
        await asyncio.gather(*(one(i) for i in range(first, min(total, first + at_once))))
    await limits.close()
    return total / (time.perf_counter() - started)


async def main(
    redis_url: str | None, users: int, rounds: int, at_once: int, only_redis: bool = False
) -> None:
    plans = Plans.model_validate({"free": {MODEL_TYPE: HIGH}})
    callers = [Caller(f"key_{i}", f"user_{i}", "free") for i in range(users)]
    print(
        f"python {platform.python_version()}; {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.2f}; users {users}"
    )
    stores = [("redis", redis_url)] if only_redis else [("memory", None), ("redis", redis_url)]
    for name, url in stores:
        storage = open_counters(url, key_prefix=f"sai-bench-{secrets.token_hex(4)}")
        limits = RateLimits(plans, storage, fail_open=False)
        await sequential(limits, callers, min(rounds, 500))  # warm up (connections, scripts)
        report(f"admit ({name})", await sequential(limits, callers, rounds))
        rate = await concurrent(limits, callers, rounds, at_once)
        print(f"{'admit + charge (' + name + ')':<34} {rate:8.0f} /s with {at_once} at once")
        if url is not None:
            await storage.clear()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(main(args.redis_url, args.users, args.rounds, args.concurrency))
