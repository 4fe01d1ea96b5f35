"""Keys through the real stack (Ray Serve + vLLM, SQLite store): every 401 case, the admin and
account APIs, and the done-when flow with the CLI and the official client."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from app.accounts.keystore import keygen
from tests.conftest import Stack, error_of
from tests.e2e.conftest import serviceai_cli

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def admin(stack: Stack) -> httpx.Client:
    with httpx.Client(
        base_url=f"{stack.origin}/admin",
        timeout=30,
        headers={"Authorization": f"Bearer {stack.admin_token}"},
    ) as client:
        yield client


def new_key(stack: Stack, admin: httpx.Client, email: str) -> tuple[dict, str]:
    user = admin.post("/users", json={"email": email})
    assert user.status_code == 201, user.text
    key = admin.post(f"/users/{user.json()['id']}/keys", json={"name": "e2e"}).json()["key"]
    stack.secrets.append(key)
    return user.json(), key


def test_new_user_creates_a_key_with_one_command_calls_revokes_and_is_refused(stack):
    created = serviceai_cli(
        stack.database_url,
        "users",
        "create",
        "--email",
        "newcomer@example.com",
        "--with-key",
        "--json",
    )
    key = created["key"]["key"]
    stack.secrets.append(key)
    client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    reply = client.chat.completions.create(model="ServiceAi-Fast", messages=HI, max_tokens=4)
    assert reply.choices[0].message.role == "assistant"

    serviceai_cli(stack.database_url, "keys", "revoke", created["key"]["id"], "--json")
    # The stack's replicas trust their cache for key_cache_ttl_s, then ask the store again.
    with pytest.raises(openai.AuthenticationError) as info:
        wait_until_refused(client, timeout_s=stack.key_cache_ttl_s + 5)
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key" and "revoked" in info.value.body["message"]


def wait_until_refused(client: openai.OpenAI, timeout_s: float) -> None:
    """Call until the key is refused (the AuthenticationError propagates) or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        client.models.list()
        time.sleep(0.2)


def test_every_401_case_through_the_stack(stack, admin):
    user, revoked = new_key(stack, admin, "refusals@example.com")
    admin.delete(f"/keys/{admin.get('/keys', params={'user': user['id']}).json()['data'][0]['id']}")
    _, disabled = new_key(stack, admin, "disabled@example.com")
    admin.patch("/users/disabled@example.com", json={"disabled": True})
    unknown = keygen.issue().secret
    stack.secrets.append(unknown)
    cases = {
        "Missing Authorization header": {},
        "must use the Bearer scheme": {"Authorization": f"Basic {unknown}"},
        "carries no API key": {"Authorization": "Bearer"},
        "malformed": {"Authorization": f"Bearer {unknown[:-2]}"},
        "not recognised": {"Authorization": f"Bearer {unknown}"},
        "revoked": {"Authorization": f"Bearer {revoked}"},
        "disabled": {"Authorization": f"Bearer {disabled}"},
    }
    for reason, headers in cases.items():
        response = httpx.post(
            f"{stack.base_url}/chat/completions",
            headers=headers,
            json={"model": "ServiceAi-Fast", "messages": HI},
        )
        error = error_of(response, 401)
        assert error["code"] == "invalid_api_key" and reason in error["message"], (reason, error)
        assert response.headers["www-authenticate"] == "Bearer"
        for secret in (unknown, revoked, disabled, unknown[:-2]):
            assert secret not in response.text


def test_account_api_through_the_stack(stack, admin):
    _, key = new_key(stack, admin, "self-service@example.com")
    with httpx.Client(
        base_url=f"{stack.base_url}/account", timeout=30, headers={"Authorization": f"Bearer {key}"}
    ) as account:
        created = account.post("/keys", json={"name": "second"})
        assert created.status_code == 201
        second = created.json()
        stack.secrets.append(second["key"])
        assert [k["name"] for k in account.get("/keys").json()["data"]] == ["e2e", "second"]
        assert account.delete(f"/keys/{second['id']}").json()["revoked"] is True
    # Revoked through this replica: refused at once, the first key still works.
    refused = openai.OpenAI(base_url=stack.base_url, api_key=second["key"], max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        refused.models.list()
    assert openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0).models.list().data


def test_admin_api_refuses_user_keys(stack):
    response = httpx.get(
        f"{stack.origin}/admin/users", headers={"Authorization": f"Bearer {stack.api_key}"}
    )
    assert error_of(response, 401)["code"] == "invalid_admin_token"
