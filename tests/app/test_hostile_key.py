"""What one hostile key can do to an ingress, in-process on a real key store (SQLite and
PostgreSQL) and the Redis of this machine: huge and slow bodies, refused requests, replies
without max_tokens, an exhausted pool, racing key creates, cursors into other users' lists."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.types import ASGIApp

from app.accounts.auth import Caller, KeyVerifier
from app.accounts.keystore import Database, KeyStore
from app.http.app import create_api
from app.limits.admission import RateLimits
from app.limits.counters import MemoryCounters, open_counters
from app.limits.plans import Plans
from app.limits.usage_meter import UsageMeter
from app.openai.errors import ApiError
from app.openai.protocol import MAX_MESSAGES
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import bearer
from tests.app.http.asgi_exchange import Exchange, http_scope
from tests.conftest import REDIS, app_args, error_of

REDIS_URL = REDIS
PLANS = Plans.model_validate(app_args()["plans"])
PRO = "ServiceAi-Pro"
FREE_PRO_RPM = PLANS.get("free").on(PRO).requests_per_minute
# About 2 MiB of empty messages: 4.4 s of CPU and 1 GiB in validation before the caps.
HUGE_BODY = b'{"model": "ServiceAi-Pro", "messages": [' + b",".join([b"{}"] * 699_000) + b"]}"


class App:
    def __init__(
        self, api: ASGIApp, client: httpx.AsyncClient, store: KeyStore, limits: RateLimits
    ) -> None:
        self.api = api
        self.client = client
        self.store = store
        self.limits = limits

    async def user(self, plan: str = "free") -> tuple[Caller, str]:
        user = await self.store.create_user(f"{secrets.token_hex(5)}@hostile.test", plan=plan)
        issued = await self.store.create_key(user.id)
        return Caller(key_id=issued.id, user_id=user.id, plan=plan), issued.key


@pytest.fixture
async def app(store: KeyStore) -> AsyncIterator[App]:
    """The API with its rate limits in Redis and a body deadline of half a second."""
    storage = open_counters(REDIS_URL, key_prefix=f"sai-test-{secrets.token_hex(4)}")
    limits = RateLimits(PLANS, storage)
    api = create_api(
        ModelEndpoints({}, created=0),
        KeyVerifier(store),
        limits,
        UsageMeter(store),
        body_read_timeout_s=0.5,
    )
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield App(api, client, store, limits)
    await limits.close()
    await storage.clear()


async def test_a_stranger_gets_401_before_a_byte_of_the_body_is_read(app):
    pieces = [HUGE_BODY[start : start + 65536] for start in range(0, len(HUGE_BODY), 65536)]
    exchange = Exchange(pieces)
    await exchange.run(
        app.api,
        http_scope(
            "/v1/chat/completions",
            ("authorization", "Bearer sai-" + "x" * 43),
            ("content-type", "application/json"),
            ("content-length", str(len(HUGE_BODY))),
        ),
    )
    assert exchange.status == 401 and b"invalid_api_key" in exchange.answer
    # The whole answer goes out first; the body is then dropped unparsed, so that the
    # connection ends without a reset.
    assert exchange.reads_before_answer() == 0 and exchange.ended_after_the_last_read()


async def test_a_stranger_is_refused_first_under_a_route_prefix_too(store):
    """Serve mounts an application at its route_prefix: the path then starts with it."""
    api = create_api(
        ModelEndpoints({}, created=0),
        KeyVerifier(store),
        RateLimits(PLANS, MemoryCounters()),
        UsageMeter(store),
        body_read_timeout_s=0.5,
    )

    async def never_sent() -> AsyncIterator[bytes]:
        yield b'{"model": '
        await asyncio.sleep(30)

    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False, root_path="/prefixed")
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post(
            "/prefixed/v1/chat/completions",
            content=never_sent(),
            headers={**bearer("sai-" + "x" * 43), "content-type": "application/json"},
        )
    assert error_of(response, 401)["code"] == "invalid_api_key"


async def test_a_huge_message_list_stops_at_the_cap_naming_the_field(app):
    _, key = await app.user()
    response = await app.client.post(
        "/v1/chat/completions",
        content=HUGE_BODY,
        headers={**bearer(key), "content-type": "application/json"},
    )
    error = error_of(response, 400)
    assert error["param"] == "messages"
    assert f"at most {MAX_MESSAGES} items" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 257}]},
            "messages[0].content",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": "x" * 257}, "stop"),
        ({"messages": [{"role": "user", "content": "hi"}], "user": "u" * 257}, "user"),
    ],
)
async def test_long_lists_and_strings_are_refused_naming_the_field(app, body, param):
    _, key = await app.user()
    response = await app.client.post(
        "/v1/chat/completions", json={"model": PRO, **body}, headers=bearer(key)
    )
    error = error_of(response, 400)
    assert error["param"] == param
    # A content-part list over the cap is reported by the first branch of its union (a string).
    assert "at most" in error["message"] or "valid string" in error["message"]


async def test_refused_bodies_count_against_the_request_rate(app):
    caller, key = await app.user()
    for _ in range(FREE_PRO_RPM):
        response = await app.client.post(
            "/v1/chat/completions", json={"model": PRO, "messages": []}, headers=bearer(key)
        )
        assert error_of(response, 400)["param"] == "messages"
    # Each 400 went out after its count was written: the next admission sees them all.
    with pytest.raises(ApiError) as refused:
        await app.limits.admit(caller, PRO, None)
    assert (refused.value.status, refused.value.type) == (429, "requests")


async def test_a_body_that_trickles_in_is_cut_off_with_408(app):
    _, key = await app.user()

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"model": "ServiceAi-Pro", '
        await asyncio.sleep(30)
        yield b'"messages": []}'

    response = await asyncio.wait_for(
        app.client.post(
            "/v1/chat/completions",
            content=trickle(),
            headers={**bearer(key), "content-type": "application/json"},
        ),
        timeout=10,
    )
    error = error_of(response, 408)
    assert error["code"] == "request_timeout" and "0.5 s" in error["message"]


async def test_a_reply_without_max_tokens_is_clamped_to_what_the_plan_has_left(app):
    caller, _ = await app.user()
    (await app.limits.admit(caller, PRO, None)).settle(15_000, 1_000)  # 4,000 left this minute
    await app.limits.close()
    admission = await app.limits.admit(caller, PRO, None, choices=8)
    assert admission.reply_length(context=2048) == 500
    assert admission.reply_length(context=300) == 300  # never past the model's context
    with pytest.raises(ApiError) as refused:  # 8 choices need at least 8 tokens
        (await app.limits.admit(caller, PRO, None)).settle(3_995, 0)
        await app.limits.close()
        await app.limits.admit(caller, PRO, None, choices=8)
    assert (refused.value.status, refused.value.type) == (429, "tokens")


async def test_an_exhausted_pool_is_503_key_store_unavailable(database_url):
    engine = create_async_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    database = Database(engine)
    store = KeyStore(database)
    try:
        await Database.open(database_url)  # the schema
        async with engine.connect():  # the pool's one connection, held
            api = create_api(
                ModelEndpoints({}, created=0),
                KeyVerifier(store),
                RateLimits(PLANS, MemoryCounters()),
                UsageMeter(store),
            )
            transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                response = await client.get("/v1/models", headers=bearer("sai-" + "y" * 43))
        error = error_of(response, 503)
        assert error["code"] == "key_store_unavailable"
        assert response.headers["Retry-After"] == "2"
    finally:
        await database.close()


async def test_parallel_creates_never_pass_the_key_limit(store):
    user = await store.create_user("racer@hostile.test")
    outcomes = await asyncio.gather(
        *(store.create_key(user.id) for _ in range(20)), return_exceptions=True
    )
    created = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(created) == store.max_keys_per_user
    assert {type(o).__name__ for o in outcomes if isinstance(o, BaseException)} == {
        "KeyLimitReached"
    }
    assert len((await store.list_keys(user.id)).data) == store.max_keys_per_user


async def test_a_cursor_into_another_users_list_reads_as_unknown(app):
    _, key = await app.user()
    other, _ = await app.user()
    mine = await app.client.get("/v1/account/keys?after=key_doesnotexist", headers=bearer(key))
    theirs = await app.client.get(f"/v1/account/keys?after={other.key_id}", headers=bearer(key))
    assert error_of(theirs, 400)["message"].replace(other.key_id, "X") == error_of(mine, 400)[
        "message"
    ].replace("key_doesnotexist", "X")


async def test_docs_and_openapi_can_be_switched_off(store):
    api = create_api(
        ModelEndpoints({}, created=0),
        KeyVerifier(store),
        RateLimits(PLANS, MemoryCounters()),
        UsageMeter(store),
        api_docs=False,
    )
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert error_of(await client.get(path), 404)["code"] == "unknown_url"
