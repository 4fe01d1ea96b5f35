"""The HTTP API in-process (httpx over ASGI) on a real key store, SQLite and PostgreSQL."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.http.app import create_api
from app.limits.admission import RateLimits
from app.limits.counters import MemoryCounters, open_counters
from app.limits.plans import Plans
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from tests.app.shipped_plans import PLANS, REDIS_URL
from tests.conftest import app_args

ADMIN_TOKEN = secrets.token_urlsafe(32)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def shipped_limits() -> RateLimits:
    """The plans of serve_config.yaml, counted in memory."""
    return RateLimits(Plans.model_validate(app_args()["plans"]), MemoryCounters())


@pytest.fixture
async def api(store: KeyStore) -> AsyncIterator[httpx.AsyncClient]:
    """The ServiceAi API (no model types) with the admin API on."""
    app = create_api(
        ModelEndpoints({}, created=0),
        KeyVerifier(store),
        shipped_limits(),
        UsageMeter(store),
        SecretStr(ADMIN_TOKEN),
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


@pytest.fixture
def admin(api: httpx.AsyncClient) -> httpx.AsyncClient:
    api.headers.update(bearer(ADMIN_TOKEN))
    return api


@pytest.fixture(params=["memory", "redis"])
async def limits(request) -> AsyncIterator[RateLimits]:
    """The shipped plans on each storage; the Redis keys of a test get their own prefix."""
    if request.param == "memory":
        yield RateLimits(PLANS, MemoryCounters())
        return
    storage = open_counters(REDIS_URL, key_prefix=f"sai-test-{secrets.token_hex(4)}")
    limits = RateLimits(PLANS, storage)
    yield limits
    await limits.close()
    await storage.clear()
