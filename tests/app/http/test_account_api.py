"""/v1/account: a key holder manages their own keys, on SQLite and PostgreSQL."""

import pytest

from tests.app.conftest import bearer
from tests.conftest import error_of


@pytest.fixture
async def ada(store):
    user = await store.create_user("ada@example.com")
    return user, (await store.create_key(user.id, "first")).key


async def test_the_account_shows_its_user(api, ada):
    user, key = ada
    response = await api.get("/v1/account", headers=bearer(key))
    assert response.json() == user.model_dump()


async def test_create_list_and_revoke_own_keys(api, ada):
    user, key = ada
    auth = bearer(key)
    created = await api.post("/v1/account/keys", json={"name": "  ci  "}, headers=auth)
    assert created.status_code == 201
    new = created.json()
    assert (new["object"], new["user_id"], new["name"], new["revoked"]) == (
        "api_key",
        user.id,
        "ci",
        False,
    )
    assert (await api.get("/v1/models", headers=bearer(new["key"]))).status_code == 200
    assert (await api.post("/v1/account/keys", headers=auth)).json()["name"] is None

    listed = (await api.get("/v1/account/keys", headers=auth)).json()
    assert [k["name"] for k in listed["data"]] == ["first", "ci", None]
    assert all("key" not in k for k in listed["data"]) and new["key"] not in str(listed)

    revoked = await api.delete(f"/v1/account/keys/{new['id']}", headers=auth)
    assert revoked.status_code == 200 and revoked.json()["revoked"]
    assert (
        "revoked"
        in error_of(await api.get("/v1/models", headers=bearer(new["key"])), 401)["message"]
    )
    assert (await api.get("/v1/account/keys", headers=auth)).status_code == 200


async def test_a_user_cannot_touch_another_users_keys(api, store, ada):
    _, key = ada
    bob = await store.create_user("bob@example.com")
    bobs = await store.create_key(bob.id)
    error = error_of(await api.delete(f"/v1/account/keys/{bobs.id}", headers=bearer(key)), 404)
    assert error["code"] == "api_key_not_found"
    assert (await api.get("/v1/models", headers=bearer(bobs.key))).status_code == 200
    listed = (await api.get("/v1/account/keys", headers=bearer(key))).json()["data"]
    assert bobs.id not in {k["id"] for k in listed}


async def test_a_key_can_revoke_itself(api, ada):
    _, key = ada
    own = (await api.get("/v1/account/keys", headers=bearer(key))).json()["data"][0]
    assert (
        await api.delete(f"/v1/account/keys/{own['id']}", headers=bearer(key))
    ).status_code == 200
    assert (
        error_of(await api.get("/v1/account/keys", headers=bearer(key)), 401)["code"]
        == "invalid_api_key"
    )


async def test_limits_and_bad_input(api, store, ada):
    _, key = ada
    for _ in range(store.max_keys_per_user - 1):
        assert (await api.post("/v1/account/keys", headers=bearer(key))).status_code == 201
    error = error_of(await api.post("/v1/account/keys", headers=bearer(key)), 409)
    assert error["code"] == "api_key_limit_reached"
    error = error_of(
        await api.post("/v1/account/keys", json={"name": "x" * 101}, headers=bearer(key)), 400
    )
    assert error["param"] == "name"


@pytest.mark.parametrize("path", ["/v1/account", "/v1/account/keys"])
async def test_the_account_needs_a_key(api, path):
    assert error_of(await api.get(path), 401)["code"] == "invalid_api_key"
