"""Scoped keys on the real stack: a key made with the CLI for one model type, with its own
request rate and a monthly budget; the official client sees OpenAI's errors."""

from __future__ import annotations

import secrets
from datetime import datetime

import httpx
import openai
import pytest

from tests.conftest import Stack, error_of
from tests.e2e.conftest import serviceai_cli
from tests.e2e.test_limits import usage_of

HI = [{"role": "user", "content": "hi"}]


def scoped_key(stack: Stack, *options: str) -> dict:
    """A new free-plan user's key made with `serviceai keys create OPTIONS --json`."""
    user = serviceai_cli(
        stack.database_url,
        "users",
        "create",
        "--email",
        f"{secrets.token_hex(5)}@scopes.test",
        "--json",
    )
    key = serviceai_cli(
        stack.database_url, "keys", "create", "--user", user["id"], *options, "--json"
    )
    stack.secrets.append(key["key"])
    return key


def test_a_key_for_one_type_with_its_own_rate(stack: Stack):
    key = scoped_key(stack, "--models", "ServiceAi-Coder", "--requests-per-minute", "3")
    client = openai.OpenAI(base_url=stack.base_url, api_key=key["key"], max_retries=0)
    assert [m.id for m in client.models.list().data] == ["ServiceAi-Coder"]
    with pytest.raises(openai.PermissionDeniedError) as denied:
        client.chat.completions.create(model="ServiceAi-Fast", messages=HI, max_tokens=2)
    assert denied.value.body["code"] == "model_not_allowed"
    assert "ServiceAi-Coder" in denied.value.body["message"]
    # Its own 3 a minute, beside the free plan's 10 on Coder (the refusal above counted none).
    for _ in range(3):
        client.chat.completions.create(model="ServiceAi-Coder", messages=HI, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="ServiceAi-Coder", messages=HI, max_tokens=2)
    assert "this API key's requests per minute: limit 3" in limited.value.body["message"]
    assert int(limited.value.response.headers["retry-after"]) >= 1


def test_an_expired_key_and_a_spent_monthly_budget(stack: Stack):
    expired = scoped_key(stack, "--expires-at", "2020-01-01T00:00:00Z")
    client = openai.OpenAI(base_url=stack.base_url, api_key=expired["key"], max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        client.models.list()
    assert "expired at 2020-01-01T00:00:00Z" in refused.value.body["message"]

    budgeted = scoped_key(stack, "--monthly-tokens", "300")
    client = openai.OpenAI(base_url=stack.base_url, api_key=budgeted["key"], max_retries=0)
    first = client.chat.completions.create(
        model="ServiceAi-Fast", messages=HI, max_tokens=150, extra_body={"ignore_eos": True}
    )
    used = first.usage.total_tokens
    assert first.usage.completion_tokens == 150
    with pytest.raises(openai.RateLimitError) as spent:
        client.chat.completions.create(model="ServiceAi-Fast", messages=HI, max_tokens=200)
    error = spent.value
    assert error.body["code"] == "insufficient_quota"
    assert error.response.headers["x-should-retry"] == "false"
    assert f"{300 - used} of 300 tokens left this month" in error.body["message"]
    # The usage report shows the budget used once the ingress has written its usage.
    usage_of(stack.base_url, budgeted["key"], 1)
    report = serviceai_cli(stack.database_url, "usage", "--key", budgeted["id"], "--json")
    assert report["budget"] == {
        **report["budget"],
        "monthly_tokens": 300,
        "used": used,
        "left": 300 - used,
    }


def test_a_narrow_key_can_do_no_more_than_its_owner_gave_it(stack: Stack):
    """Issue 70's holes, as an attacker holding one narrow key tried them: a key made without
    key management rotates, revokes, changes and creates nothing (403, nothing changed); a
    managing key for one type rotates a wider key into one no wider than itself; a key with a
    budget of its own mints no key that would start that budget afresh."""
    owner = scoped_key(stack)
    user = owner["user_id"]

    def key(*options: str) -> dict:
        made = serviceai_cli(
            stack.database_url, "keys", "create", "--user", user, *options, "--json"
        )
        stack.secrets.append(made["key"])
        return made

    ci = key("--models", "ServiceAi-Coder", "--expires-in", "1h", "--no-manage-keys")
    api = httpx.Client(base_url=stack.origin, timeout=60)
    as_ci = {"Authorization": f"Bearer {ci['key']}"}
    for method, path, body in [
        ("POST", f"/v1/account/keys/{owner['id']}/rotate", {"grace_seconds": 0}),
        ("DELETE", f"/v1/account/keys/{owner['id']}", None),
        ("PATCH", f"/v1/account/keys/{owner['id']}", {"models": ["ServiceAi-Coder"]}),
        ("POST", "/v1/account/keys", {"models": ["ServiceAi-Coder"]}),
    ]:
        refused = api.request(method, path, json=body, headers=as_ci)
        assert error_of(refused, 403)["code"] == "key_management_not_allowed", (method, path)
    wide = openai.OpenAI(base_url=stack.base_url, api_key=owner["key"], max_retries=0)
    assert wide.chat.completions.create(model="ServiceAi-Fast", messages=HI, max_tokens=2)

    narrow = key("--models", "ServiceAi-Coder", "--expires-in", "1h")
    rotated = api.post(
        f"/v1/account/keys/{owner['id']}/rotate",
        json={"grace_seconds": 3600},
        headers={"Authorization": f"Bearer {narrow['key']}"},
    )
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    stack.secrets.append(new["key"])
    assert new["models"] == ["ServiceAi-Coder"]
    expiry = [datetime.fromisoformat(k["expires_at"]).timestamp() for k in (new, narrow)]
    assert abs(expiry[0] - expiry[1]) < 1
    minted = openai.OpenAI(base_url=stack.base_url, api_key=new["key"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        minted.chat.completions.create(model="ServiceAi-Fast", messages=HI, max_tokens=2)
    assert denied.value.body["code"] == "model_not_allowed"

    budgeted = key("--monthly-tokens", "60")
    child = api.post(
        "/v1/account/keys",
        json={"monthly_tokens": 60},
        headers={"Authorization": f"Bearer {budgeted['key']}"},
    )
    assert error_of(child, 403)["code"] == "key_has_limits"
