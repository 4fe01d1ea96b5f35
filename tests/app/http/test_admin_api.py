"""/admin: the operators' API, on SQLite and PostgreSQL."""

import httpx
import pytest

from app.accounts.auth import KeyVerifier
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import ADMIN_TOKEN, bearer, shipped_limits
from tests.conftest import error_of


async def create_user(admin, email="ada@example.com", **fields) -> dict:
    response = await admin.post("/admin/users", json={"email": email, **fields})
    assert response.status_code == 201, response.text
    return response.json()


async def create_key(admin, user: str, name: str | None = None) -> dict:
    response = await admin.post(f"/admin/users/{user}/keys", json={"name": name} if name else None)
    assert response.status_code == 201, response.text
    return response.json()


async def test_without_an_admin_token_the_admin_api_does_not_exist(store):
    app = create_api(
        ModelEndpoints({}, created=0), KeyVerifier(store), shipped_limits(), UsageMeter(store)
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        response = await client.get("/admin/users", headers=bearer(ADMIN_TOKEN))
        assert error_of(response, 404)["code"] == "unknown_url"
        paths = (await client.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p.startswith("/admin")]
    assert "/v1/account/keys" in paths


async def test_the_admin_api_is_in_the_openapi_schema(api):
    schema = (await api.get("/openapi.json")).json()
    assert {
        "/admin/users",
        "/admin/users/{user}",
        "/admin/users/{user}/keys",
        "/admin/keys",
        "/admin/keys/{key_id}",
        "/admin/keys/{key_id}/rotate",
    } <= set(schema["paths"])
    assert set(schema["paths"]["/admin/keys/{key_id}"]) == {"delete", "patch"}
    assert {"AdminToken", "ApiKey"} <= set(schema["components"]["securitySchemes"])


@pytest.mark.parametrize("token", [None, "wrong-" + "x" * 30, "user-key"])
async def test_only_the_admin_token_opens_it(api, store, token):
    if token == "user-key":
        user = await store.create_user("ada@example.com")
        token = (await store.create_key(user.id)).key
    response = await api.get("/admin/users", headers=bearer(token) if token else {})
    error = error_of(response, 401)
    assert error["code"] == "invalid_admin_token"
    assert response.headers["www-authenticate"] == "Bearer"
    assert token is None or token not in response.text


async def test_users(admin):
    ada = await create_user(admin, "Ada@Example.com")
    assert (ada["object"], ada["email"], ada["plan"], ada["disabled"]) == (
        "user",
        "ada@example.com",
        "free",
        False,
    )
    pro = await create_user(admin, "bob@example.com", plan="pro")
    assert pro["plan"] == "pro"
    assert (await admin.get("/admin/users/ada@example.com")).json() == ada
    page = (await admin.get("/admin/users", params={"limit": 1})).json()
    assert (page["object"], [u["id"] for u in page["data"]], page["has_more"]) == (
        "list",
        [ada["id"]],
        True,
    )
    page = (await admin.get("/admin/users", params={"after": ada["id"]})).json()
    assert ([u["id"] for u in page["data"]], page["has_more"]) == ([pro["id"]], False)
    newest = (await admin.get("/admin/users", params={"order": "desc"})).json()
    assert [u["id"] for u in newest["data"]] == [pro["id"], ada["id"]]
    page = (await admin.get("/admin/users", params={"order": "desc", "after": pro["id"]})).json()
    assert ([u["id"] for u in page["data"]], page["has_more"]) == ([ada["id"]], False)
    changed = (await admin.patch(f"/admin/users/{ada['id']}", json={"plan": "pro"})).json()
    assert changed["plan"] == "pro" and not changed["disabled"]


async def test_roles_and_the_audit_log(admin):
    ada = await create_user(admin)
    assert ada["role"] == "user"
    made = (await admin.patch(f"/admin/users/{ada['id']}", json={"role": "admin"})).json()
    assert made["role"] == "admin"
    key = await create_key(admin, ada["id"], "ci")
    assert (await admin.delete(f"/admin/keys/{key['id']}")).status_code == 200
    refused = await admin.patch(f"/admin/users/{ada['id']}", json={"role": "root"})
    assert error_of(refused, 400)["param"] == "role"

    log = (await admin.get("/admin/audit", params={"limit": 3})).json()
    assert [(e["source"], e["actor"], e["action"], e["target"]) for e in log["data"]] == [
        ("admin_api", "admin token", "key.revoke", key["id"]),
        ("admin_api", "admin token", "key.create", key["id"]),
        ("admin_api", "admin token", "user.set_role", "ada@example.com"),
    ]
    assert log["has_more"]
    rest = (await admin.get("/admin/audit", params={"before": log["data"][-1]["id"]})).json()
    assert [e["action"] for e in rest["data"]] == ["user.create"] and not rest["has_more"]


@pytest.mark.parametrize(
    ("request_args", "status", "code", "param"),
    [
        (("post", "/admin/users", {"email": "not-an-email"}), 400, "invalid_value", "email"),
        (
            ("post", "/admin/users", {"email": "x@example.com", "plan": "Gold Plan"}),
            400,
            "invalid_value",
            "plan",
        ),
        (
            ("post", "/admin/users", {"email": "x@example.com", "admin": True}),
            400,
            "invalid_value",
            "admin",
        ),
        (("post", "/admin/users", {}), 400, "missing_required_parameter", "email"),
        (("get", "/admin/users/nobody@example.com", None), 404, "user_not_found", "user"),
        (("patch", "/admin/users/user_nope", {"disabled": True}), 404, "user_not_found", "user"),
        (("post", "/admin/users/user_nope/keys", None), 404, "user_not_found", "user"),
        (("delete", "/admin/keys/key_nope", None), 404, "api_key_not_found", "key_id"),
        (("get", "/admin/keys?user=user_nope", None), 404, "user_not_found", "user"),
        (("get", "/admin/users?limit=0", None), 400, "invalid_value", "limit"),
        (("get", "/admin/users?after=user_gone", None), 400, "invalid_value", "after"),
        (("get", "/admin/keys?order=newest", None), 400, "invalid_value", "order"),
        (("get", f"/admin/audit?before={2**31}", None), 400, "invalid_value", "before"),
        (("get", f"/admin/audit?before={2**63}", None), 400, "invalid_value", "before"),
    ],
)
async def test_errors_are_in_the_openai_envelope(admin, request_args, status, code, param):
    method, path, body = request_args
    response = await admin.request(method, path, json=body)
    error = error_of(response, status)
    assert (error["code"], error["param"]) == (code, param)


async def test_a_second_user_with_the_same_email_is_a_409(admin):
    await create_user(admin)
    error = error_of(await admin.post("/admin/users", json={"email": "ADA@example.com"}), 409)
    assert error["code"] == "user_exists" and "ada@example.com" in error["message"]


async def test_keys_revocation_and_disabling(admin):
    ada = await create_user(admin)
    first, second = (
        await create_key(admin, ada["id"], "laptop"),
        await create_key(admin, ada["email"]),
    )
    assert first["key"].startswith("sai-") and first["name"] == "laptop" and second["name"] is None
    models = "/v1/models"
    for key in (first, second):
        assert (await admin.get(models, headers=bearer(key["key"]))).status_code == 200

    listed = (await admin.get("/admin/keys", params={"user": ada["email"]})).json()["data"]
    assert [k["id"] for k in listed] == [first["id"], second["id"]]
    assert all("key" not in k and k["display"].startswith("sai-...") for k in listed)
    assert listed[0]["last_used_at"] is None  # written in batches, not per request

    revoked = (await admin.delete(f"/admin/keys/{first['id']}")).json()
    assert revoked["revoked"] and revoked["revoked_at"] is not None
    error = error_of(await admin.get(models, headers=bearer(first["key"])), 401)
    assert error["code"] == "invalid_api_key" and "revoked" in error["message"]
    assert (await admin.get(models, headers=bearer(second["key"]))).status_code == 200

    await admin.patch(f"/admin/users/{ada['id']}", json={"disabled": True})
    error = error_of(await admin.get(models, headers=bearer(second["key"])), 401)
    assert "disabled" in error["message"]
    error = error_of(await admin.post(f"/admin/users/{ada['id']}/keys"), 409)
    assert error["code"] == "user_disabled"
    await admin.patch(f"/admin/users/{ada['id']}", json={"disabled": False})
    assert (await admin.get(models, headers=bearer(second["key"]))).status_code == 200
    assert (await admin.get(models, headers=bearer(first["key"]))).status_code == 401
