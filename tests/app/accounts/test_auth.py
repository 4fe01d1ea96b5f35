"""The request-time verifier: every refusal names its case, the cache keeps the store off the
hot path, revocations land within the TTL, last-used times are written in batches."""

import asyncio

import pytest

from app.accounts.auth import (
    MALFORMED,
    REVOKED,
    UNKNOWN,
    USER_DISABLED,
    Caller,
    KeyVerifier,
)
from app.accounts.keystore import Database, KeyStore, keygen
from app.accounts.keystore.database import create_engine
from app.accounts.keystore.errors import StoreUnavailable
from app.openai.errors import ApiError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore:
    """The real store, counting the lookups that reach it."""

    def __init__(self, store: KeyStore) -> None:
        self._store = store
        self.lookups = 0
        self.batches: list[dict] = []
        self.fail_writes = False

    async def find_key(self, key_hash):
        self.lookups += 1
        return await self._store.find_key(key_hash)

    async def record_last_used(self, used):
        self.batches.append(dict(used))
        if self.fail_writes:
            raise StoreUnavailable("down")
        await self._store.record_last_used(used)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def counting(store: KeyStore) -> CountingStore:
    return CountingStore(store)


@pytest.fixture
def verifier(counting: CountingStore, clock: Clock) -> KeyVerifier:
    return KeyVerifier(counting, ttl_s=10, max_entries=100, clock=clock)  # type: ignore[arg-type]


async def refusal(verifier: KeyVerifier, token: str) -> str:
    with pytest.raises(ApiError) as info:
        await verifier.verify(token)
    error = info.value
    assert (error.status, error.code, error.type) == (
        401,
        "invalid_api_key",
        "invalid_request_error",
    )
    assert error.headers == {"WWW-Authenticate": "Bearer"}
    assert token not in error.message and keygen.hash_key(token) not in error.message
    return error.message


async def test_a_valid_key_is_its_caller(store, verifier):
    user = await store.create_user("ada@example.com", plan="pro")
    key = await store.create_key(user.id)
    assert await verifier.verify(key.key) == Caller(key_id=key.id, user_id=user.id, plan="pro")


async def test_each_refusal_says_why(store, verifier):
    user = await store.create_user("ada@example.com")
    revoked, kept = await store.create_key(user.id), await store.create_key(user.id)
    await store.revoke_key(revoked.id)
    assert (await refusal(verifier, "sai-short")).startswith(MALFORMED)
    assert (await refusal(verifier, keygen.issue().secret)).startswith(UNKNOWN)
    assert (await refusal(verifier, revoked.key)).startswith(REVOKED)
    assert await verifier.verify(kept.key)
    other = await store.create_key(user.id)
    await store.update_user(user.id, disabled=True)
    assert (await refusal(verifier, other.key)).startswith(USER_DISABLED)


async def test_cached_keys_do_not_reach_the_store_until_the_ttl_ends(
    store, verifier, counting, clock
):
    user = await store.create_user("ada@example.com")
    key = await store.create_key(user.id)
    unknown = keygen.issue().secret
    for _ in range(50):
        await verifier.verify(key.key)
        await refusal(verifier, unknown)
    assert counting.lookups == 2
    await store.revoke_key(key.id)  # elsewhere: this replica learns of it when the entry expires
    clock.now += 9.9
    assert await verifier.verify(key.key)
    clock.now += 0.2
    assert (await refusal(verifier, key.key)).startswith(REVOKED)
    assert counting.lookups == 3


async def test_a_change_made_through_this_replica_is_seen_at_once(store, verifier):
    user = await store.create_user("ada@example.com")
    a, b = await store.create_key(user.id), await store.create_key(user.id)
    await verifier.verify(a.key), await verifier.verify(b.key)
    await store.revoke_key(a.id)
    verifier.forget(key_id=a.id)
    assert (await refusal(verifier, a.key)).startswith(REVOKED)
    assert await verifier.verify(b.key)
    await store.update_user(user.id, disabled=True)
    verifier.forget(user_id=user.id)
    assert (await refusal(verifier, b.key)).startswith(USER_DISABLED)


async def test_concurrent_misses_for_one_key_ask_the_store_once(store, verifier, counting):
    user = await store.create_user("ada@example.com")
    key = await store.create_key(user.id)
    callers = await asyncio.gather(*(verifier.verify(key.key) for _ in range(20)))
    assert len(set(callers)) == 1 and counting.lookups == 1


async def test_the_cache_is_bounded(store, counting, clock):
    verifier = KeyVerifier(counting, ttl_s=10, max_entries=3, clock=clock)  # type: ignore[arg-type]
    user = await store.create_user("ada@example.com")
    keys = [await store.create_key(user.id) for _ in range(5)]
    for key in keys:
        await verifier.verify(key.key)
    assert len(verifier.accepted) == 3
    for _ in range(30):
        await refusal(verifier, keygen.issue().secret)
    assert len(verifier.refused) == 1 and len(verifier.accepted) == 3


async def test_ttl_zero_asks_the_store_every_time(store, counting):
    verifier = KeyVerifier(counting, ttl_s=0)  # type: ignore[arg-type]
    key = await store.create_key((await store.create_user("ada@example.com")).id)
    for _ in range(3):
        await verifier.verify(key.key)
    assert counting.lookups == 3


async def test_last_used_is_written_in_batches_not_per_request(store, verifier, counting):
    user = await store.create_user("ada@example.com")
    a, b = await store.create_key(user.id), await store.create_key(user.id)
    for _ in range(100):
        await verifier.verify(a.key)
        await verifier.verify(b.key)
    assert counting.batches == []
    await verifier.flush()
    assert [set(batch) for batch in counting.batches] == [{a.id, b.id}]
    listed = {k.id: k.last_used_at for k in (await store.list_keys(user.id)).data}
    assert listed[a.id] is not None and listed[b.id] is not None
    await verifier.flush()
    assert len(counting.batches) == 1  # nothing new, nothing written


async def test_an_unreachable_store_is_a_503():
    database = Database(create_engine("postgresql+asyncpg://postgres@127.0.0.1:1/none"))
    down = KeyVerifier(KeyStore(database))
    with pytest.raises(StoreUnavailable) as info:
        await down.verify(keygen.issue().secret)
    assert (info.value.status, info.value.code) == (503, "key_store_unavailable")
    await database.close()


async def test_last_used_times_survive_a_failed_write(store, verifier, counting):
    key = await store.create_key((await store.create_user("ada@example.com")).id)
    await verifier.verify(key.key)
    counting.fail_writes = True
    await verifier.flush()
    counting.fail_writes = False
    await verifier.flush()
    assert [set(batch) for batch in counting.batches] == [{key.id}, {key.id}]
    assert (await store.list_keys(key.user_id)).data[0].last_used_at is not None


async def test_a_repeated_authorization_header_is_a_401_not_a_500(api, store):
    # Found by the hostile-input tests: the refusal's metric label was missing (500).
    user = await store.create_user("twice@serviceai.test")
    key = (await store.create_key(user.id, "k")).key
    headers = [("Authorization", f"Bearer {key}"), ("Authorization", f"Bearer {key}")]
    response = await api.get("/v1/models", headers=headers)
    assert response.status_code == 401, response.text
    assert "more than one Authorization header" in response.json()["error"]["message"]
