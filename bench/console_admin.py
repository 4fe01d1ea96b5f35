"""How long each operator page of the console takes on a large key store (PostgreSQL).

    .venv/bin/python -m bench.console_admin --server postgresql://postgres@127.0.0.1:5432

Makes (or, with --reuse, keeps) a database `serviceai_bench_console` on that server holding
10,000 users, 20,000 keys, 1,000,000 daily-usage rows over the last 90 UTC days on three model
types (and their per-day sums in daily_model_usage), and 100,000 audit entries; then asks the console for each operator page as a signed-in
operator would (in process, httpx over ASGI: the page's own time, no network) and prints the
median and the slowest of --rounds requests. The target is < 300 ms per page.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import re
import statistics
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import yaml
from pydantic import SecretStr

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import Database, KeyStore
from app.config.settings import Settings
from app.console import mount_console
from app.http.app import create_api
from app.limits.admission import RateLimits
from app.limits.counters import MemoryCounters
from app.limits.plans import Plans
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints

DATABASE = "serviceai_bench_console"
USERS = 10_000
KEYS_PER_USER = 2
ROWS_PER_KEY = 50  # 20,000 keys x 50 = 1,000,000 daily-usage rows
AUDIT_ENTRIES = 100_000
MODEL_TYPES = ["ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder"]
OPERATOR = "operator@bench.example"
PASSWORD = "a benchmark operator password"


class NoModel:
    """The model types' handles: no operator page calls a model."""

    def options(self, **_: object) -> NoModel:
        return self


async def seed(server: str) -> None:
    """A fresh database with the store's schema (Alembic) and the rows, by COPY."""
    admin = await asyncpg.connect(f"{server}/postgres")
    await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await admin.execute(f"CREATE DATABASE {DATABASE}")
    await admin.close()
    database = await Database.open(store_url(server))
    store = KeyStore(database)
    operator = await store.create_user(OPERATOR, password=PASSWORD)
    await store.update_user(operator.id, role="admin")
    await database.close()

    now = datetime.now(UTC)
    today = now.date()
    pairs = [(model, today - timedelta(days=d)) for d in range(90) for model in MODEL_TYPES]
    connection = await asyncpg.connect(f"{server}/{DATABASE}")
    started = time.perf_counter()
    await connection.copy_records_to_table(
        "users",
        columns=["id", "email", "plan", "created_at", "session_version", "role"],
        records=[
            (
                f"user_bench{i:05d}",
                f"user-{i}@bench.example",
                ("free", "pro")[i % 2],
                now - timedelta(seconds=USERS - i),
                0,
                "user",
            )
            for i in range(USERS)
        ],
    )
    await connection.copy_records_to_table(
        "api_keys",
        columns=["id", "user_id", "key_hash", "display", "name", "created_at"],
        records=[
            (
                f"key_bench{k:06d}",
                f"user_bench{k // KEYS_PER_USER:05d}",
                f"{k:064x}",
                f"sai-...{k % 10000:04d}",
                f"key {k}",
                now - timedelta(seconds=k),
            )
            for k in range(USERS * KEYS_PER_USER)
        ],
    )
    await connection.copy_records_to_table(
        "daily_usage",
        columns=["key_id", "model_type", "day", "requests", "prompt_tokens", "completion_tokens"],
        records=[
            (
                f"key_bench{k:06d}",
                *pairs[(k * 7 + j) % len(pairs)],
                1 + (k + j) % 40,
                100 * (1 + (k * j) % 50),
                50 * (1 + (k + j) % 30),
            )
            for k in range(USERS * KEYS_PER_USER)
            for j in range(ROWS_PER_KEY)
        ],
    )
    await connection.copy_records_to_table(
        "audit_log",
        columns=["at", "source", "actor", "action", "target", "detail"],
        records=[
            (
                now - timedelta(seconds=AUDIT_ENTRIES - n),
                "console",
                OPERATOR,
                "user.set_plan",
                f"user-{n % USERS}@bench.example",
                "free → pro",
            )
            for n in range(AUDIT_ENTRIES)
        ],
    )
    # What KeyStore.record_usage keeps beside daily_usage as it writes (migration 0007 fills
    # it the same way from what a store held before).
    await connection.execute(
        "INSERT INTO daily_model_usage SELECT day, model_type, SUM(requests), "
        "SUM(prompt_tokens), SUM(completion_tokens) FROM daily_usage GROUP BY day, model_type"
    )
    await connection.execute("ANALYZE")
    counts = [
        await connection.fetchval(f"SELECT count(*) FROM {t}")
        for t in ("users", "api_keys", "daily_usage", "audit_log")
    ]
    await connection.close()
    print(
        f"seeded in {time.perf_counter() - started:.0f} s: users, keys, daily_usage, "
        f"audit_log = {counts}"
    )


def store_url(server: str) -> str:
    return f"{server.replace('postgresql://', 'postgresql+asyncpg://', 1)}/{DATABASE}"


async def console_client(store: KeyStore) -> httpx.AsyncClient:
    config = yaml.safe_load(open("serve_config.yaml"))
    plans = Plans.model_validate(config["applications"][0]["args"]["plans"])
    api = create_api(
        ModelEndpoints({name: NoModel() for name in MODEL_TYPES}, created=0),
        KeyVerifier(store),
        RateLimits(plans, MemoryCounters()),
        UsageMeter(store),
    )
    mount_console(api, Settings(session_secret=SecretStr("b" * 40)))
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://127.0.0.1:8000", timeout=60
    )
    form = await client.get("/console/sign-in")
    token = re.search(r'name="csrf_token" value="([^"]+)"', form.text).group(1)
    signed_in = await client.post(
        "/console/sign-in", data={"csrf_token": token, "email": OPERATOR, "password": PASSWORD}
    )
    assert signed_in.status_code == 303, signed_in.text
    return client


async def measure(server: str, rounds: int) -> None:
    database = await Database.open(store_url(server))
    store = KeyStore(database)
    client = await console_client(store)
    today = datetime.now(UTC).date()
    heavy = (await store.top(today - timedelta(days=29), today, 1))[0][0].user_id
    pages = [
        "/admin/users",
        "/admin/users?q=user-4242",
        f"/admin/users/{heavy}",
        "/admin/keys",
        "/admin/plans",
        "/admin/usage?days=7",
        "/admin/usage?days=30",
        "/admin/usage?days=90",
        "/admin/usage.csv?days=90",
        "/admin/audit",
    ]
    print(
        f"python {platform.python_version()}; {os.cpu_count()} CPUs; load average "
        f"{os.getloadavg()[0]:.2f}; {rounds} rounds per page, after one warm-up"
    )
    print(f"{'page':<32} {'median ms':>10} {'slowest ms':>11} {'bytes':>9}")
    for page in pages:
        first = await client.get(f"/console{page}")
        assert first.status_code == 200, (page, first.status_code)
        samples = []
        for _ in range(rounds):
            started = time.perf_counter()
            response = await client.get(f"/console{page}")
            samples.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        print(
            f"{page:<32} {statistics.median(samples):>10.1f} {max(samples):>11.1f} "
            f"{len(first.content):>9,}"
        )
    await client.aclose()
    await database.close()


def main() -> None:
    logging.getLogger("ray.serve.serviceai").setLevel(logging.WARNING)  # no access log lines
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server",
        default="postgresql://postgres@127.0.0.1:5432",
        help="A PostgreSQL server where this may create a database.",
    )
    parser.add_argument("--reuse", action="store_true", help="Keep the seeded database.")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if not args.reuse:
        asyncio.run(seed(args.server))
    asyncio.run(measure(args.server, args.rounds))


if __name__ == "__main__":
    main()
