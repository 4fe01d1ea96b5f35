"""How long authentication takes per request: the verifier's cache hit and miss paths.

    .venv/bin/python bench/auth.py                      # a temporary SQLite store
    .venv/bin/python bench/auth.py --database-url postgresql+asyncpg://postgres@127.0.0.1/DB

Hit: the key was verified within the TTL (the steady state of every ingress replica).
Miss: the replica asks the store (first use of a key, or once per TTL per key and replica).
Each sample is one `KeyVerifier.verify` plus parsing the Authorization header, timed alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from starlette.requests import Request

from app.accounts.auth import KeyVerifier, bearer_token
from app.accounts.keystore import Database, KeyStore


def request_with(key: str) -> Request:
    return Request({"type": "http", "headers": [(b"authorization", f"Bearer {key}".encode())]})


async def timed(verifier: KeyVerifier, keys: list[str], rounds: int) -> list[float]:
    """Microseconds per verification, `rounds` times over `keys`."""
    requests = [request_with(k) for k in keys]
    samples = []
    for i in range(rounds):
        request = requests[i % len(requests)]
        started = time.perf_counter_ns()
        await verifier.verify(bearer_token(request))
        samples.append((time.perf_counter_ns() - started) / 1000)
    return samples


def report(name: str, samples: list[float]) -> None:
    cuts = statistics.quantiles(samples, n=100)
    print(f"{name:<28} n={len(samples):>6}  p50={cuts[49]:8.1f} us  p99={cuts[98]:8.1f} us")


async def main(database_url: str, keys: int, rounds: int) -> None:
    database = await Database.open(database_url)
    store = KeyStore(database, max_keys_per_user=keys)
    user = await store.create_user(f"bench-{os.getpid()}-{time.time_ns()}@example.com")
    secrets = [(await store.create_key(user.id)).key for _ in range(keys)]

    print(
        f"backend: {database.dialect}; keys: {keys}; python {platform.python_version()}; "
        f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}"
    )
    cached = KeyVerifier(store, ttl_s=3600)
    await timed(cached, secrets, keys)  # fill the cache
    report("hit (cached verdict)", await timed(cached, secrets, rounds))
    uncached = KeyVerifier(store, ttl_s=0)
    await timed(uncached, secrets, min(rounds, 200))  # warm the connection pool
    report(f"miss ({database.dialect} lookup)", await timed(uncached, secrets, min(rounds, 5000)))
    await database.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", help="a store to use (default: a temporary SQLite file)")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.database_url or f"sqlite+aiosqlite:///{Path(folder) / 'bench.db'}"
        asyncio.run(main(url, args.keys, args.rounds))
