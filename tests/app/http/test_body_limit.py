"""Request bodies over SERVICEAI_MAX_BODY_BYTES: 413 in the envelope, refused while read."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from app.http.app import create_api
from app.accounts.auth import KeyVerifier
from app.http.body_limit import DEFAULT_MAX_BODY_BYTES
from app.serving.dispatch import ModelRouter
from app.limits.usage_meter import UsageMeter
from app.config.settings import Settings
from tests.app.conftest import bearer, shipped_limits
from tests.conftest import error_of

LIMIT = 64 * 1024
PIECE = b" " * 4096


@pytest.fixture
async def limited(store) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """The API with a 64 KiB body limit, and a valid key of its store."""
    app = create_api(
        ModelRouter({}, created=0), KeyVerifier(store), shipped_limits(), UsageMeter(store),
        max_body_bytes=LIMIT,
    )
    user = await store.create_user("ada@example.com")
    key = (await store.create_key(user.id, "first")).key
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client, key


def assert_too_large(response: httpx.Response) -> None:
    error = error_of(response, 413)
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert f"{LIMIT} bytes" in error["message"]


async def test_a_declared_length_over_the_limit_is_refused_unread(limited):
    client, key = limited
    read = []

    async def body() -> AsyncIterator[bytes]:
        read.append(1)
        yield b"{}"

    response = await client.post(
        "/v1/account/keys", content=body(),
        headers={**bearer(key), "Content-Length": str(LIMIT + 1), "Content-Type": "application/json"},
    )
    assert_too_large(response)
    assert read == []


async def test_a_chunked_body_is_cut_off_at_the_limit(limited):
    client, key = limited
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"name": "'
        for _ in range(4 * LIMIT // len(PIECE)):
            sent += len(PIECE)
            yield PIECE
        yield b'"}'

    response = await client.post(
        "/v1/account/keys", content=body(),
        headers={**bearer(key), "Content-Type": "application/json"},
    )
    assert_too_large(response)
    # Refused as soon as the limit was passed, not after reading everything.
    assert sent <= LIMIT + 2 * len(PIECE)


async def test_the_limit_holds_before_authentication(limited):
    client, _ = limited
    response = await client.post(
        "/v1/chat/completions", content=b"x" * (LIMIT + 1), headers={"Content-Type": "application/json"}
    )
    assert_too_large(response)


async def test_a_body_within_the_limit_is_served(limited):
    client, key = limited
    name = "n" * 100
    body = b'{"name": "%s"%s}' % (name.encode(), b" " * (LIMIT - 200))
    response = await client.post(
        "/v1/account/keys", content=body, headers={**bearer(key), "Content-Type": "application/json"}
    )
    assert response.status_code == 201 and response.json()["name"] == name


def test_the_limit_is_a_setting_of_a_few_mib(monkeypatch):
    assert 1 * 2**20 <= Settings().max_body_bytes == DEFAULT_MAX_BODY_BYTES <= 4 * 2**20
    monkeypatch.setenv("SERVICEAI_MAX_BODY_BYTES", "65536")
    assert Settings().max_body_bytes == 65536
