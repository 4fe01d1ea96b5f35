"""CORS: closed unless SERVICEAI_CORS_ORIGINS names the browser origins that may call."""

from __future__ import annotations

import httpx
import pytest

from app.accounts.auth import KeyVerifier
from app.config.settings import Settings
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import bearer, shipped_limits

PAGE = "http://localhost:3000"
PREFLIGHT = {
    "Origin": PAGE,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def client_of(store, origins: list[str]) -> httpx.AsyncClient:
    app = create_api(
        ModelEndpoints({}, created=0),
        KeyVerifier(store),
        shipped_limits(),
        UsageMeter(store),
        cors_origins=origins,
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.fixture
async def key(store) -> str:
    user = await store.create_user("ada@example.com")
    return (await store.create_key(user.id, "first")).key


async def test_closed_by_default(store, key):
    assert Settings().cors_origins == []
    async with client_of(store, []) as client:
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        answer = await client.get("/v1/models", headers={**bearer(key), "Origin": PAGE})
    assert preflight.status_code == 405
    assert answer.status_code == 200
    for response in (preflight, answer):
        assert not [h for h in response.headers if h.startswith("access-control-")]


async def test_open_to_the_configured_origins_only(store, key, monkeypatch):
    monkeypatch.setenv("SERVICEAI_CORS_ORIGINS", f'["{PAGE}"]')
    origins = Settings().cors_origins
    assert origins == [PAGE]
    async with client_of(store, origins) as client:
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        answer = await client.get("/v1/models", headers={**bearer(key), "Origin": PAGE})
        stranger = await client.get(
            "/v1/models", headers={**bearer(key), "Origin": "https://evil.example"}
        )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == PAGE
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert answer.headers["access-control-allow-origin"] == PAGE
    assert "access-control-allow-origin" not in stranger.headers
