"""Keys an operator can scope, through the admin and account APIs, on SQLite and PostgreSQL:
allowed model types, expiry, the key's own limits, a monthly budget, rotation; a key holder
narrows their keys and never widens them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from pydantic import SecretStr

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import ADMIN_TOKEN, bearer, shipped_limits
from tests.app.serve_fakes import FakeHandle
from tests.conftest import error_of

TYPES = ("ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder")
HI = [{"role": "user", "content": "hi"}]
SCOPES = {
    "models": ["ServiceAi-Coder"],
    "expires_at": "2099-01-31T00:00:00Z",
    "limits": {
        "requests_per_minute": 5,
        "tokens_per_minute": 5000,
        "concurrent_requests": 1,
        "tokens_per_day": 50000,
    },
    "monthly_tokens": 100000,
}


@pytest.fixture
async def api(store: KeyStore) -> AsyncIterator[httpx.AsyncClient]:
    """The API with the three types (no replica serves them: nothing here reaches one)."""
    app = create_api(
        ModelEndpoints({name: FakeHandle(name) for name in TYPES}, created=0),
        KeyVerifier(store, ttl_s=3600),
        shipped_limits(),
        UsageMeter(store),
        SecretStr(ADMIN_TOKEN),
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


@pytest.fixture
async def ada(store: KeyStore) -> tuple[str, str]:
    """(ada's user id, an unscoped key of hers)."""
    user = await store.create_user("ada@example.com")
    return user.id, (await store.create_key(user.id, "main")).key


def admin() -> dict[str, str]:
    return bearer(ADMIN_TOKEN)


async def test_an_operator_scopes_a_key_and_changes_its_scopes(api, ada):
    user_id, _ = ada
    created = await api.post(
        f"/admin/users/{user_id}/keys", json={"name": "app", **SCOPES}, headers=admin()
    )
    assert created.status_code == 201, created.text
    key = created.json()
    assert {field: key[field] for field in SCOPES} == SCOPES
    listed = (await api.get("/admin/keys", params={"user": user_id}, headers=admin())).json()
    assert [k["models"] for k in listed["data"]] == [None, ["ServiceAi-Coder"]]

    # A field sent replaces it, null clears it, a field left out stays.
    patched = await api.patch(
        f"/admin/keys/{key['id']}",
        headers=admin(),
        json={"models": None, "limits": {"requests_per_minute": 9}},
    )
    assert patched.status_code == 200, patched.text
    changed = patched.json()
    assert changed["models"] is None and changed["expires_at"] == SCOPES["expires_at"]
    assert changed["limits"] == {
        "requests_per_minute": 9,
        "tokens_per_minute": None,
        "concurrent_requests": None,
        "tokens_per_day": None,
    }
    assert changed["monthly_tokens"] == 100000

    unknown = await api.patch(
        f"/admin/keys/{key['id']}", json={"models": ["GPT-9"]}, headers=admin()
    )
    error = error_of(unknown, 400)
    assert error["param"] == "models" and "ServiceAi-Coder" in error["message"]
    for bad in (
        {"limits": {"requests_per_minute": 0}},
        {"expires_at": "2099-01-31T00:00:00"},
        {"monthly_tokens": -1},
        {"models": []},
        {"colour": "red"},
    ):
        assert (
            await api.patch(f"/admin/keys/{key['id']}", json=bad, headers=admin())
        ).status_code == 400, bad


@pytest.mark.parametrize(
    "scopes",
    [
        {"limits": {"concurrent_requests": 2**31}},
        {"limits": {"requests_per_minute": 2**31}},
        {"limits": {"tokens_per_day": 2**63}},
        {"limits": {"tokens_per_minute": 2**63}},
        {"monthly_tokens": 2**63},
        # Moments whose offset carries them out of years 1-9999 in UTC (found by the fuzzer).
        {"expires_at": "0001-01-01T00:00:00+00:01"},
        {"expires_at": "9999-12-31T23:59:59-00:01"},
    ],
)
async def test_a_number_beyond_what_the_store_holds_is_a_400_on_every_door(api, store, ada, scopes):
    user_id, key = ada
    param = next(iter(scopes["limits"])) if "limits" in scopes else next(iter(scopes))
    for method, path, headers in [
        ("post", f"/admin/users/{user_id}/keys", admin()),
        ("post", "/v1/account/keys", bearer(key)),
        ("patch", f"/admin/keys/{(await store.list_keys(user_id)).data[0].id}", admin()),
    ]:
        refused = await api.request(method, path, json=scopes, headers=headers)
        assert param in error_of(refused, 400)["param"], (method, path)
    if "monthly_tokens" in scopes:
        refused = await api.patch(f"/admin/users/{user_id}", json=scopes, headers=admin())
        assert error_of(refused, 400)["param"] == "monthly_tokens"
    assert len((await store.list_keys(user_id)).data) == 1


async def test_a_key_calls_only_its_model_types(api, store, ada):
    user_id, _ = ada
    coder = await store.create_key(user_id, "coder", _scopes(models=["ServiceAi-Coder"]))
    refused = await api.post(
        "/v1/chat/completions",
        headers=bearer(coder.key),
        json={"model": "ServiceAi-Fast", "messages": HI},
    )
    error = error_of(refused, 403)
    assert (error["code"], error["param"]) == ("model_not_allowed", "model")
    assert "ServiceAi-Fast" in error["message"] and "ServiceAi-Coder" in error["message"]
    for path in ("/v1/completions", "/v1/responses"):
        body = {"model": "ServiceAi-Pro", "prompt": "hi", "input": "hi"}
        body = {
            k: v
            for k, v in body.items()
            if (k == "prompt") == (path == "/v1/completions") or k == "model"
        }
        assert (
            error_of(await api.post(path, json=body, headers=bearer(coder.key)), 403)["code"]
            == "model_not_allowed"
        )
    retrieved = await api.get("/v1/models/ServiceAi-Pro", headers=bearer(coder.key))
    assert error_of(retrieved, 403)["code"] == "model_not_allowed"
    # An unknown model is still a 404 first, naming only the types the key may call.
    for path, body in [
        ("/v1/chat/completions", {"model": "nope", "messages": HI}),
        ("/v1/messages/count_tokens", {"model": "nope", "messages": HI}),
    ]:
        refused = await api.post(path, headers=bearer(coder.key), json=body)
        assert refused.status_code == 404
        error = refused.json()["error"]  # Anthropic's envelope holds it too
        assert error["message"].endswith("Available models: ServiceAi-Coder."), error
    error = error_of(await api.get("/v1/models/nope", headers=bearer(coder.key)), 404)
    assert error["message"].endswith("Available models: ServiceAi-Coder."), error
    # Another type's adapter: a 403 naming the key's scope, never that type's adapters.
    error = error_of(await api.get("/v1/models/ServiceAi-Pro:acme", headers=bearer(coder.key)), 403)
    assert error["code"] == "model_not_allowed" and "acme" not in error["message"].split(";")[1]


async def test_an_expired_key_is_refused_on_time_whatever_the_cache_holds(api, store, ada):
    user_id, _ = ada
    past = await store.create_key(user_id, "old", _scopes(expires_at="2020-01-01T00:00:00Z"))
    error = error_of(await api.get("/v1/account", headers=bearer(past.key)), 401)
    assert error["code"] == "invalid_api_key"
    assert "expired at 2020-01-01T00:00:00Z" in error["message"]

    soon = datetime.now(UTC) + timedelta(seconds=1.5)
    expiring = await store.create_key(user_id, "soon", _scopes(expires_at=soon.isoformat()))
    assert (await api.get("/v1/account", headers=bearer(expiring.key))).status_code == 200
    # The verdict is cached for an hour (ttl_s=3600): the expiry still takes effect on time.
    while datetime.now(UTC) < soon:
        time.sleep(0.05)
    error = error_of(await api.get("/v1/account", headers=bearer(expiring.key)), 401)
    assert "expired" in error["message"]


async def test_rotation_gives_a_new_key_with_the_scopes_and_a_grace_period(api, store, ada):
    user_id, _ = ada
    old = await store.create_key(
        user_id, "deploy", _scopes(models=["ServiceAi-Pro"], monthly_tokens=500)
    )
    rotated = await api.post(
        f"/admin/keys/{old.id}/rotate", json={"grace_seconds": 3600}, headers=admin()
    )
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert new["id"] != old.id and new["key"] != old.key
    assert (new["name"], new["models"], new["monthly_tokens"]) == ("deploy", ["ServiceAi-Pro"], 500)
    for secret in (old.key, new["key"]):  # both work during the grace period
        assert (await api.get("/v1/account", headers=bearer(secret))).status_code == 200
    before = (await api.get("/admin/keys", params={"user": user_id}, headers=admin())).json()
    [listed] = [k for k in before["data"] if k["id"] == old.id]
    assert listed["revoked"] is False and listed["revoked_at"] > time.time() + 3500

    # A key with a budget of its own rotates nothing, itself included (a fresh key would
    # start its budget afresh); the holder's unscoped key rotates it with no grace: it stops.
    refused = await api.post(
        f"/v1/account/keys/{new['id']}/rotate",
        json={"grace_seconds": 0},
        headers=bearer(new["key"]),
    )
    assert error_of(refused, 403)["code"] == "key_has_limits"
    again = await api.post(
        f"/v1/account/keys/{new['id']}/rotate",
        json={"grace_seconds": 0},
        headers=bearer(ada[1]),
    )
    assert again.status_code == 201, again.text
    assert again.json()["monthly_tokens"] == 500
    error = error_of(await api.get("/v1/account", headers=bearer(new["key"])), 401)
    assert "revoked" in error["message"]
    assert (await api.get("/v1/account", headers=bearer(again.json()["key"]))).status_code == 200
    # A revoked key has nothing to rotate.
    assert error_of(await api.post(f"/admin/keys/{new['id']}/rotate", headers=admin()), 404)


async def test_a_key_holder_narrows_keys_and_never_widens_them(api, store, ada):
    user_id, main = ada
    scoped = await store.create_key(
        user_id,
        "scoped",
        _scopes(models=["ServiceAi-Fast", "ServiceAi-Coder"], limits={"tokens_per_minute": 1000}),
    )
    own = bearer(main)
    narrowed = await api.patch(
        f"/v1/account/keys/{scoped.id}",
        headers=own,
        json={"models": ["ServiceAi-Coder"], "limits": {"tokens_per_minute": 500}},
    )
    assert narrowed.status_code == 200, narrowed.text
    assert narrowed.json()["models"] == ["ServiceAi-Coder"]
    for wider, field in (
        ({"models": None}, "models"),
        ({"models": ["ServiceAi-Pro"]}, "models"),
        ({"limits": {"tokens_per_minute": 600}}, "limits.tokens_per_minute"),
        ({"limits": None}, "limits.tokens_per_minute"),
    ):
        error = error_of(
            await api.patch(f"/v1/account/keys/{scoped.id}", json=wider, headers=own), 403
        )
        assert (error["code"], error["param"]) == ("scope_not_narrower", field)

    # A key with limits of its own makes none (its child would not share its counters).
    made = await api.post("/v1/account/keys", headers=bearer(scoped.key), json={"name": "x"})
    assert error_of(made, 403)["code"] == "key_has_limits"
    # A scoped key makes keys at most as wide as itself.
    typed = await store.create_key(
        user_id,
        "typed",
        _scopes(models=["ServiceAi-Fast", "ServiceAi-Coder"], expires_at="2099-06-01T00:00:00Z"),
    )
    made = await api.post("/v1/account/keys", headers=bearer(typed.key), json={"name": "wider"})
    assert error_of(made, 403)["param"] == "models"
    made = await api.post(
        "/v1/account/keys",
        headers=bearer(typed.key),
        json={
            "name": "narrower",
            "models": ["ServiceAi-Coder"],
            "limits": {"tokens_per_minute": 100},
            "expires_at": "2099-01-01T00:00:00Z",
        },
    )
    assert made.status_code == 201, made.text
    # The unscoped key may give a new key any scope.
    assert (
        await api.post("/v1/account/keys", headers=own, json={"monthly_tokens": 10})
    ).status_code == 201


async def test_a_key_without_key_management_manages_nothing_but_itself(api, store, ada):
    """A leaked CI key (made without `manage_keys`) lists, creates, changes, rotates and
    revokes no other key: 403, nothing changed; it may narrow or revoke itself."""
    user_id, main = ada
    ci = await store.create_key(
        user_id, "ci", _scopes(models=["ServiceAi-Coder"], manage_keys=False)
    )
    [main_key] = [k for k in (await store.list_keys(user_id)).data if k.name == "main"]
    own = bearer(ci.key)
    for method, path, body in [
        ("get", "/v1/account/keys", None),
        ("post", "/v1/account/keys", {"models": ["ServiceAi-Coder"]}),
        ("patch", f"/v1/account/keys/{main_key.id}", {"models": ["ServiceAi-Coder"]}),
        ("post", f"/v1/account/keys/{main_key.id}/rotate", {"grace_seconds": 0}),
        ("post", f"/v1/account/keys/{ci.id}/rotate", {"grace_seconds": 0}),
        ("delete", f"/v1/account/keys/{main_key.id}", None),
    ]:
        refused = await api.request(method, path, json=body, headers=own)
        assert error_of(refused, 403)["code"] == "key_management_not_allowed", (method, path)
    assert await store.get_key(main_key.id) == main_key
    assert len((await store.list_keys(user_id)).data) == 2
    assert (await api.get("/v1/account", headers=bearer(main))).status_code == 200
    # It cannot give itself the permission, and narrows or revokes itself.
    widened = await api.patch(f"/v1/account/keys/{ci.id}", json={"manage_keys": True}, headers=own)
    assert error_of(widened, 403)["param"] == "manage_keys"
    narrowed = await api.patch(
        f"/v1/account/keys/{ci.id}", json={"expires_at": "2099-01-01T00:00:00Z"}, headers=own
    )
    assert narrowed.status_code == 200, narrowed.text
    assert (await api.delete(f"/v1/account/keys/{ci.id}", headers=own)).json()["revoked"]
    # A managing key may give a new key no management; an operator's default is to manage.
    made = await api.post("/v1/account/keys", json={"manage_keys": False}, headers=bearer(main))
    assert made.json()["manage_keys"] is False
    assert (await api.post(f"/admin/users/{user_id}/keys", json={}, headers=admin())).json()[
        "manage_keys"
    ] is True


async def test_a_narrow_key_rotates_a_wider_one_into_a_key_no_wider_than_itself(api, store, ada):
    """The hole of issue 70: a key for one type, expiring soon, rotated an all-models key and
    received a secret for every type that never expires. Now the new key keeps only what the
    rotating key covers."""
    user_id, main = ada
    [main_key] = (await store.list_keys(user_id)).data
    narrow = await store.create_key(
        user_id,
        "narrow",
        _scopes(models=["ServiceAi-Coder"], expires_at="2099-01-01T00:00:00Z"),
    )
    rotated = await api.post(
        f"/v1/account/keys/{main_key.id}/rotate",
        json={"grace_seconds": 3600},
        headers=bearer(narrow.key),
    )
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert (new["models"], new["expires_at"]) == (["ServiceAi-Coder"], "2099-01-01T00:00:00Z")
    refused = await api.post(
        "/v1/chat/completions",
        headers=bearer(new["key"]),
        json={"model": "ServiceAi-Fast", "messages": HI},
    )
    assert error_of(refused, 403)["code"] == "model_not_allowed"
    # A key whose models the rotating key does not cover at all is not rotated.
    pro = await store.create_key(user_id, "pro", _scopes(models=["ServiceAi-Pro"]))
    refused = await api.post(f"/v1/account/keys/{pro.id}/rotate", headers=bearer(narrow.key))
    assert error_of(refused, 403)["param"] == "models"
    assert not (await store.get_key(pro.id)).revoked_at


async def test_rotation_counts_against_the_most_keys_a_user_holds(api, store, ada):
    """Chained rotations with a long grace gave any number of live keys: each key in its grace
    counts, so a user at the most keys rotates only with no grace."""
    user_id, main = ada
    for name in ("two", "three", "four", "five"):  # the store of these tests allows 5
        await store.create_key(user_id, name)
    keys = (await store.list_keys(user_id)).data
    refused = await api.post(
        f"/v1/account/keys/{keys[1].id}/rotate", json={"grace_seconds": 60}, headers=bearer(main)
    )
    assert error_of(refused, 409)["code"] == "api_key_limit_reached"
    assert not (await store.get_key(keys[1].id)).revoked_at
    now = await api.post(
        f"/v1/account/keys/{keys[1].id}/rotate", json={"grace_seconds": 0}, headers=bearer(main)
    )
    assert now.status_code == 201, now.text
    await api.delete(f"/v1/account/keys/{keys[2].id}", headers=bearer(main))
    graced = await api.post(
        f"/v1/account/keys/{keys[3].id}/rotate", json={"grace_seconds": 60}, headers=bearer(main)
    )
    assert graced.status_code == 201, graced.text
    # Five keys work now (one in its grace): neither a rotation with grace nor a create.
    again = await api.post(
        f"/v1/account/keys/{graced.json()['id']}/rotate",
        json={"grace_seconds": 60},
        headers=bearer(main),
    )
    assert error_of(again, 409)["code"] == "api_key_limit_reached"
    created = await api.post("/v1/account/keys", json={}, headers=bearer(main))
    assert error_of(created, 409)["code"] == "api_key_limit_reached"


async def test_a_users_monthly_budget_is_set_and_cleared_and_shown_with_usage(api, ada):
    user_id, main = ada
    patched = await api.patch(
        f"/admin/users/{user_id}", json={"monthly_tokens": 1000}, headers=admin()
    )
    assert patched.json()["monthly_tokens"] == 1000
    usage = (await api.get("/v1/account/usage", headers=bearer(main))).json()
    assert usage["budget"] == {
        "month": datetime.now(UTC).strftime("%Y-%m"),
        "monthly_tokens": 1000,
        "used": 0,
        "left": 1000,
    }
    cleared = await api.patch(
        f"/admin/users/{user_id}", json={"monthly_tokens": None}, headers=admin()
    )
    assert cleared.json()["monthly_tokens"] is None
    assert (await api.get("/v1/account/usage", headers=bearer(main))).json()["budget"] is None


def _scopes(**fields):
    from app.accounts.keystore.schemas import KeyScopes

    return KeyScopes.model_validate(fields)
