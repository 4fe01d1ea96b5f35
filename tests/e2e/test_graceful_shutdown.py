"""Redeploying or stopping an ingress: its open streams finish, and the last-used times it
still held in memory reach the key store.

Runs a second, ingress-only application over the session's model types, with its own key
store and a flush period far longer than the test, so only the shutdown flush can write."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from ray import serve

from app.accounts.keystore import Database, KeyStore
from app.builder import build_app
from tests.conftest import APP_NAME, app_args
from tests.e2e.test_stream_lifecycle import wait_until

APP = "drain"
# Long enough to outlast the ~2 s the ingress needs to drain, short enough to finish in time.
STREAM = {
    "model": "ServiceAi-Fast",
    "messages": [{"role": "user", "content": "go"}],
    "max_tokens": 200,
    "ignore_eos": True,
    "stream": True,
}


def drain_app_args(database_url: str, **ingress: object) -> dict:
    args = dict(app_args(), models_app=APP_NAME)
    args["ingress"] = dict(
        args["ingress"],
        graceful_shutdown_timeout_s=30,
        env_vars={"SERVICEAI_DATABASE_URL": database_url, "SERVICEAI_LAST_USED_FLUSH_S": "3600"},
        **ingress,
    )
    return args


async def new_key(database_url: str) -> tuple[str, str]:
    database = await Database.open(database_url)
    try:
        store = KeyStore(database)
        user = await store.create_user("drain@serviceai.test")
        issued = await store.create_key(user.id, "drain")
        return issued.key, issued.id
    finally:
        await database.close()


async def last_used_at(database_url: str, key_id: str) -> int | None:
    database = await Database.open(database_url)
    try:
        [key] = [k for k in (await KeyStore(database).list_keys()).data if k.id == key_id]
        return key.last_used_at
    finally:
        await database.close()


@pytest.fixture
def drain(stack, tmp_path: Path) -> Iterator[tuple[str, str, str, str]]:
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'drain.db'}"
    key, key_id = asyncio.run(new_key(database_url))
    serve.run(build_app(drain_app_args(database_url)), name=APP, route_prefix=f"/{APP}")
    yield f"{stack.origin}/{APP}", key, key_id, database_url
    if APP in serve.status().applications:
        serve.delete(APP)


def stream_across(origin: str, key: str, change: Callable[[], None]) -> list[dict]:
    """Open a stream, apply `change` (in a thread) once it flows, and read the stream to its end."""
    with httpx.stream(
        "POST",
        f"{origin}/v1/chat/completions",
        json=STREAM,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        head = [next(lines) for _ in range(3)]
        changing = threading.Thread(target=change)
        changing.start()
        rest = [line for line in lines if line]
    changing.join(timeout=120)
    assert not changing.is_alive()
    assert rest[-1] == "data: [DONE]", rest[-3:]
    return [json.loads(line.removeprefix("data: ")) for line in [*head, *rest[:-1]] if line]


def finished_normally(chunks: list[dict]) -> bool:
    return (
        not [c for c in chunks if "error" in c]
        and chunks[-1]["choices"][0]["finish_reason"] == "length"
    )


def test_redeploy_and_shutdown_let_open_streams_finish_and_flush_last_used(drain):
    origin, key, key_id, database_url = drain
    started = int(time.time())

    def redeploy() -> None:
        serve.run(
            build_app(drain_app_args(database_url, max_ongoing_requests=512)),
            name=APP,
            route_prefix=f"/{APP}",
        )

    assert finished_normally(stream_across(origin, key, redeploy))
    # The replaced replica writes its last-used time as it stops (the period is an hour); it
    # stops once its stream is done, which may be after the new version is up.
    wait_until(
        lambda: (asyncio.run(last_used_at(database_url, key_id)) or 0) >= started, timeout_s=30
    )
    models = httpx.get(f"{origin}/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert models.status_code == 200

    used_before_stop = int(time.time())
    assert finished_normally(stream_across(origin, key, lambda: serve.delete(APP)))
    assert (asyncio.run(last_used_at(database_url, key_id)) or 0) >= used_before_stop
