"""Every operator action leaves one audit entry, written with the action or not at all."""

from datetime import timedelta

import pytest

from app.accounts.keystore import KeyStore
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.errors import KeyNotFound, UserExists

OPERATOR = Actor.operator("root@example.com")


async def actions(store: KeyStore) -> list[tuple[str, str, str, str]]:
    page = await store.audit_log(limit=100)
    return [(e.source, e.actor, e.action, e.target) for e in page.data]


async def test_each_operator_action_is_logged_newest_first(store: KeyStore):
    user = await store.create_user("ada@example.com", actor=OPERATOR)
    await store.update_user(user.id, plan="pro", actor=OPERATOR)
    await store.update_user(user.id, role="admin", actor=OPERATOR)
    key = await store.create_key(user.id, "ci", actor=OPERATOR)
    rotated = await store.rotate_key(key.id, timedelta(0), actor=OPERATOR)
    await store.update_key(rotated.id, {"monthly_tokens": 1000}, actor=OPERATOR)
    await store.revoke_key(rotated.id, actor=OPERATOR)
    await store.update_user(user.id, disabled=True, actor=OPERATOR)

    who = ("console", "root@example.com")
    assert await actions(store) == [
        (*who, "user.disable", "ada@example.com"),
        (*who, "key.revoke", rotated.id),
        (*who, "key.update", rotated.id),
        (*who, "key.rotate", key.id),
        (*who, "key.create", key.id),
        (*who, "user.set_role", "ada@example.com"),
        (*who, "user.set_plan", "ada@example.com"),
        (*who, "user.create", "ada@example.com"),
    ]
    entries = (await store.audit_log()).data
    assert entries[5].detail == "user → admin" and entries[6].detail == "free → pro"
    assert entries[4].detail == 'for ada@example.com, named "ci"'
    assert (await store.get_user(user.id)).role == "admin"


async def test_a_users_own_changes_and_refused_actions_leave_no_entry(store: KeyStore):
    user = await store.create_user("ada@example.com")
    key = await store.create_key(user.id, "mine")
    await store.revoke_key(key.id, owner_id=user.id)
    with pytest.raises(UserExists):
        await store.create_user("ada@example.com", actor=OPERATOR)
    with pytest.raises(KeyNotFound):
        await store.revoke_key("key_nope", actor=OPERATOR)
    assert await actions(store) == []


async def test_the_log_pages_back_from_the_newest(store: KeyStore):
    for n in range(5):
        await store.create_user(f"u{n}@example.com", actor=Actor.admin_api())
    first = await store.audit_log(limit=2)
    assert [e.target for e in first.data] == ["u4@example.com", "u3@example.com"]
    assert first.has_more
    second = await store.audit_log(limit=2, before=first.data[-1].id)
    third = await store.audit_log(limit=2, before=second.data[-1].id)
    assert [e.target for e in second.data + third.data] == [
        "u2@example.com",
        "u1@example.com",
        "u0@example.com",
    ]
    assert not third.has_more
    assert {e.source for e in first.data} == {"admin_api"}


async def test_users_are_found_by_part_of_their_email_and_counted_per_plan(store: KeyStore):
    for email, plan in [
        ("ada@example.com", "pro"),
        ("bob@example.org", "free"),
        ("a_b@example.com", "free"),
    ]:
        await store.create_user(email, plan)
    found = await store.list_users(email_contains=" EXAMPLE.COM ")
    assert [u.email for u in found.data] == ["ada@example.com", "a_b@example.com"]
    # '_' and '%' are the text itself, not wildcards.
    assert [u.email for u in (await store.list_users(email_contains="a_b")).data] == [
        "a_b@example.com"
    ]
    assert (await store.list_users(email_contains="%")).data == []
    assert await store.users_per_plan() == {"pro": 1, "free": 2}
