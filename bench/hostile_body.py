"""CPU and memory one 2 MiB `{"messages": [{}, {}, ...]}` body costs the ingress, in-process.

    PYTHONPATH=. .venv/bin/python bench/hostile_body.py        # CPU time (no tracing)
    PYTHONPATH=. .venv/bin/python bench/hostile_body.py mem    # peak allocation (tracemalloc)

The whole API (no Ray, no engines) on a throw-away SQLite key store, through httpx's ASGI
transport; once with a valid key and once with a bad one. Figures: README, reliability table.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import httpx
import yaml

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import Database, KeyStore
from app.http.app import create_api
from app.limits.admission import RateLimits
from app.limits.counters import MemoryCounters
from app.limits.plans import Plans
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints

SERVE_CONFIG = Path(__file__).resolve().parent.parent / "serve_config.yaml"


def plans() -> Plans:
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    return Plans.model_validate(config["applications"][0]["args"]["plans"])


async def main(trace: bool) -> None:
    folder = tempfile.mkdtemp(prefix="sai-hostile-")
    database = await Database.open(f"sqlite+aiosqlite:///{folder}/keys.db")
    store = KeyStore(database)
    user = await store.create_user("bench@hostile.test", plan="pro")
    key = (await store.create_key(user.id)).key
    api = create_api(
        ModelEndpoints({}, created=0),
        KeyVerifier(store),
        RateLimits(plans(), MemoryCounters()),
        UsageMeter(store),
    )
    count = (2 * 1024 * 1024 - 60) // 3
    body = b'{"model": "ServiceAi-Fast", "messages": [' + b",".join([b"{}"] * count) + b"]}"
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for name, token in (("valid key", key), ("bad key", "sai-" + "x" * 43)):
            if trace:
                tracemalloc.start()
            started = time.process_time()
            response = await client.post(
                "/v1/chat/completions",
                content=body,
                headers={"Authorization": f"Bearer {token}", "content-type": "application/json"},
            )
            cpu = time.process_time() - started
            peak = tracemalloc.get_traced_memory()[1] if trace else 0
            tracemalloc.stop()
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"{len(body)} bytes, {count} messages, {name}: {response.status_code}, "
                f"CPU {cpu:.2f} s, peak allocated {peak / 2**20:.0f} MiB, max RSS {rss:.0f} MiB"
            )
    await database.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] == ["mem"]))
