"""PostgreSQL goes away and comes back: clear 503s while it is down, normal service after,
without restarting anything. The API runs in process on a real PostgreSQL database, reached
through a TCP proxy this test cuts (the shared server itself is never touched)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import Database, KeyStore
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import bearer, shipped_limits
from tests.conftest import PostgresDatabases, error_of
from tests.tcp_proxy import TcpProxy


@pytest.fixture
async def outage(
    postgres: PostgresDatabases,
) -> AsyncIterator[tuple[TcpProxy, httpx.AsyncClient, str]]:
    url = await postgres.empty()
    server = urlsplit(url)
    proxy = await TcpProxy(server.hostname, server.port or 5432).start()
    database = await Database.open(
        url.replace(server.netloc, f"{server.username}@127.0.0.1:{proxy.port}")
    )
    store = KeyStore(database)
    user = await store.create_user("ada@example.com")
    key = (await store.create_key(user.id, "first")).key
    # No verdict cache: every request asks the store, as a cache miss would.
    app = create_api(
        ModelEndpoints({}, created=0),
        KeyVerifier(store, ttl_s=0),
        shipped_limits(),
        UsageMeter(store),
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://test", headers=bearer(key)
    ) as client:
        yield proxy, client, key
    await database.close()
    await proxy.close()


async def test_postgresql_outage_is_503_then_recovers_without_restart(outage):
    proxy, client, _ = outage
    assert (await client.get("/v1/account")).status_code == 200

    await proxy.cut()
    for path in ("/v1/account", "/v1/models", "/v1/account/keys"):
        response = await client.get(path)
        error = error_of(response, 503)
        assert error["code"] == "key_store_unavailable" and error["type"] == "server_error"
        assert int(response.headers["retry-after"]) > 0
    assert error_of(await client.post("/v1/account/keys", json={"name": "x"}), 503)["code"] == (
        "key_store_unavailable"
    )

    await proxy.restore()
    assert (await client.get("/v1/account")).status_code == 200
    assert (await client.post("/v1/account/keys", json={"name": "after"})).status_code == 201
