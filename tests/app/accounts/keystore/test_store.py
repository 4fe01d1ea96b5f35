"""The key store's operations, on SQLite and on PostgreSQL."""

from datetime import UTC, datetime, timedelta

import pytest
from argon2 import PasswordHasher
from sqlalchemy import select

from app.accounts.keystore import KeyStore, keygen, passwords
from app.accounts.keystore.errors import (
    KeyLimitReached,
    KeyNotFound,
    KeyStoreError,
    UserDisabled,
    UserExists,
    UserNotFound,
    WrongCredentials,
)
from app.accounts.keystore.tables import ApiKeyRow, UserRow


async def test_a_new_user_gets_the_free_plan(store: KeyStore):
    user = await store.create_user("  Ada@Example.COM ")
    assert (user.email, user.plan, user.disabled, user.disabled_at) == (
        "ada@example.com",
        "free",
        False,
        None,
    )
    assert user.id.startswith("user_")
    assert abs(user.created_at - datetime.now(UTC).timestamp()) < 60
    assert await store.get_user("ADA@example.com") == user
    assert await store.get_user(user.id) == user
    assert (await store.create_user("bob@example.com", plan="pro")).plan == "pro"


async def test_emails_are_unique(store: KeyStore):
    await store.create_user("ada@example.com")
    with pytest.raises(UserExists) as info:
        await store.create_user("ADA@example.com")
    assert info.value.status == 409 and info.value.param == "email"


async def test_a_key_is_stored_only_as_its_hash(store: KeyStore):
    user = await store.create_user("ada@example.com")
    issued = await store.create_key(user.email, "laptop")
    assert (issued.user_id, issued.name, issued.revoked, issued.last_used_at) == (
        user.id,
        "laptop",
        False,
        None,
    )
    assert issued.display == f"sai-...{issued.key[-4:]}"
    async with store.database.transaction() as session:
        row = await session.scalar(select(ApiKeyRow).where(ApiKeyRow.id == issued.id))
    assert row.key_hash == keygen.hash_key(issued.key)
    assert issued.key not in {str(v) for v in vars(row).values()}
    listed = (await store.list_keys(user.id)).data
    assert [k.id for k in listed] == [issued.id]
    assert "key" not in listed[0].model_dump()


async def test_revoking_one_key_leaves_the_others(store: KeyStore):
    user = await store.create_user("ada@example.com")
    first, second = await store.create_key(user.id), await store.create_key(user.id)
    revoked = await store.revoke_key(first.id)
    assert revoked.revoked and revoked.revoked_at is not None
    assert (await store.find_key(keygen.hash_key(first.key))).revoked
    assert not (await store.find_key(keygen.hash_key(second.key))).revoked
    assert (await store.revoke_key(first.id)).revoked_at == revoked.revoked_at  # again: unchanged


async def test_disabling_a_user_stops_all_their_keys(store: KeyStore):
    user = await store.create_user("ada@example.com")
    keys = [await store.create_key(user.id) for _ in range(2)]
    disabled = await store.update_user(user.email, disabled=True)
    assert disabled.disabled and disabled.disabled_at is not None
    for key in keys:
        assert (await store.find_key(keygen.hash_key(key.key))).user_disabled
    with pytest.raises(UserDisabled):
        await store.create_key(user.id)
    enabled = await store.update_user(user.id, disabled=False, plan="pro")
    assert (enabled.disabled, enabled.plan) == (False, "pro")
    owner = await store.find_key(keygen.hash_key(keys[0].key))
    assert (owner.user_disabled, owner.plan, owner.user_id, owner.key_id) == (
        False,
        "pro",
        user.id,
        keys[0].id,
    )


async def test_unknown_key_user_and_owner(store: KeyStore):
    assert await store.find_key(keygen.hash_key(keygen.issue().secret)) is None
    with pytest.raises(UserNotFound):
        await store.create_key("nobody@example.com")
    with pytest.raises(UserNotFound):
        await store.list_keys("user_000")
    ada = await store.create_user("ada@example.com")
    bob = await store.create_user("bob@example.com")
    key = await store.create_key(ada.id)
    with pytest.raises(KeyNotFound):
        await store.revoke_key(key.id, owner_id=bob.id)
    with pytest.raises(KeyNotFound):
        await store.revoke_key("key_missing")
    assert not (await store.find_key(keygen.hash_key(key.key))).revoked


async def test_active_keys_per_user_are_limited(store: KeyStore):
    user = await store.create_user("ada@example.com")
    keys = [await store.create_key(user.id) for _ in range(store.max_keys_per_user)]
    with pytest.raises(KeyLimitReached):
        await store.create_key(user.id)
    await store.revoke_key(keys[0].id)
    await store.create_key(user.id)


async def test_lists_are_paged_oldest_first(store: KeyStore):
    created = [await store.create_user(f"u{i}@example.com") for i in range(5)]
    first = await store.list_users(limit=2)
    assert [u.id for u in first.data] == [u.id for u in created[:2]] and first.has_more
    rest = await store.list_users(limit=10, after=first.data[-1].id)
    assert [u.id for u in rest.data] == [u.id for u in created[2:]] and not rest.has_more
    with pytest.raises(KeyStoreError) as info:
        await store.list_users(after="user_gone")
    assert (info.value.status, info.value.param) == (400, "after")


async def test_lists_are_paged_newest_first_on_request(store: KeyStore):
    created = [await store.create_user(f"u{i}@example.com") for i in range(5)]
    first = await store.list_users(limit=2, order="desc")
    assert [u.id for u in first.data] == [u.id for u in created[:2:-1]] and first.has_more
    rest = await store.list_users(limit=10, after=first.data[-1].id, order="desc")
    assert [u.id for u in rest.data] == [u.id for u in created[2::-1]] and not rest.has_more
    keys = [await store.create_key(created[0].id, f"k{i}") for i in range(3)]
    newest = await store.list_keys(created[0].email, limit=2, order="desc")
    assert [k.id for k in newest.data] == [keys[2].id, keys[1].id] and newest.has_more
    last = await store.list_keys(limit=2, after=newest.data[-1].id, order="desc")
    assert [k.id for k in last.data] == [keys[0].id] and not last.has_more


async def test_last_used_times_are_written_in_one_batch_and_never_go_back(store: KeyStore):
    user = await store.create_user("ada@example.com")
    a, b = await store.create_key(user.id), await store.create_key(user.id)
    later = datetime.now(UTC).replace(microsecond=0)
    await store.record_last_used({a.id: later, b.id: later - timedelta(minutes=1)})
    await store.record_last_used({a.id: later - timedelta(hours=1)})
    used = {k.id: k.last_used_at for k in (await store.list_keys(user.id)).data}
    assert used == {a.id: int(later.timestamp()), b.id: int(later.timestamp()) - 60}


async def test_passwords_are_stored_as_argon2id_hashes(store: KeyStore):
    await store.create_user("ada@example.com", password="first password")
    cli_made = await store.create_user("ops@example.com")
    async with store.database.transaction() as session:
        rows = {r.email: r for r in await session.scalars(select(UserRow))}
    assert rows["ada@example.com"].password_hash.startswith("$argon2id$")
    assert "first password" not in rows["ada@example.com"].password_hash
    assert rows["ops@example.com"].password_hash is None

    signed_in = await store.check_password(" ADA@example.com", "first password")
    assert signed_in.email == "ada@example.com"
    for email, password in [
        ("ada@example.com", "First password"),
        ("ops@example.com", ""),
        ("nobody@example.com", "first password"),
    ]:
        with pytest.raises(WrongCredentials) as info:
            await store.check_password(email, password)
        assert info.value.status == 401
        assert info.value.message == "The email or the password is not right."

    assert await store.set_password(cli_made.id, "second password") == cli_made
    assert (await store.check_password("ops@example.com", "second password")).id == cli_made.id
    with pytest.raises(UserNotFound):
        await store.set_password("nobody@example.com", "second password")


async def test_a_hash_made_with_weaker_parameters_is_upgraded_at_sign_in(store: KeyStore):
    user = await store.create_user("ada@example.com")
    weak = PasswordHasher(time_cost=1, memory_cost=8192, parallelism=1).hash("old password")
    async with store.database.transaction() as session:
        (await session.get(UserRow, user.id)).password_hash = weak
    await store.check_password("ada@example.com", "old password")
    async with store.database.transaction() as session:
        upgraded = (await session.get(UserRow, user.id)).password_hash
    assert upgraded != weak and not passwords.needs_rehash(upgraded)
    assert (await store.check_password("ada@example.com", "old password")).id == user.id
