"""Usage through the account API (one's own) and the admin API (anyone's), and plan checks."""

from datetime import date

import pytest

from app.accounts.keystore.usage import UsageCount, UsageKey, today
from tests.app.conftest import bearer
from tests.conftest import error_of

DAY = date(2026, 11, 20)


@pytest.fixture
async def usage(store):
    """Ada's key and Bob's key, each with some usage on DAY; (ada's key secret, ada, bob)."""
    ada = await store.create_user("ada@example.com")
    bob = await store.create_user("bob@example.com")
    ada_key = await store.create_key(ada.id)
    bob_key = await store.create_key(bob.id)
    await store.record_usage(
        {
            UsageKey(ada_key.id, "ServiceAi-Pro", DAY): UsageCount(2, 20, 30),
            UsageKey(bob_key.id, "ServiceAi-Fast", DAY): UsageCount(1, 1, 1),
        }
    )
    return ada_key.key, ada, bob


async def test_a_key_holder_sees_their_own_usage_only(api, usage):
    secret, ada, _ = usage
    response = await api.get(
        "/v1/account/usage",
        params={"start_date": "2026-11-01", "end_date": "2026-11-30"},
        headers=bearer(secret),
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["object"], body["start_date"]) == ("list", "2026-11-01")
    [row] = body["data"]
    assert row == {
        "object": "usage",
        "date": "2026-11-20",
        "user_id": ada.id,
        "key_id": row["key_id"],
        "model": "ServiceAi-Pro",
        "requests": 2,
        "prompt_tokens": 20,
        "completion_tokens": 30,
        "total_tokens": 50,
    }
    default = (await api.get("/v1/account/usage", headers=bearer(secret))).json()
    assert default["end_date"] == today().isoformat()


async def test_operators_see_anyones_usage_and_bad_ranges_are_400(admin, usage):
    _, ada, bob = usage
    day = {"start_date": "2026-11-20", "end_date": "2026-11-20"}
    everyone = (await admin.get("/admin/usage", params=day)).json()
    assert {r["user_id"] for r in everyone["data"]} == {ada.id, bob.id}
    only_bob = (await admin.get("/admin/usage", params={"user": "bob@example.com", **day})).json()
    assert [r["model"] for r in only_bob["data"]] == ["ServiceAi-Fast"]
    backwards = {"start_date": "2026-11-21", "end_date": "2026-11-20"}
    error = error_of(await admin.get("/admin/usage", params=backwards), 400)
    assert error["param"] == "start_date" and "after" in error["message"]
    nobody = await admin.get("/admin/usage", params={"user": "x@example.com"})
    assert error_of(nobody, 404)["code"] == "user_not_found"
    assert (await admin.get("/admin/usage", params={"start_date": "soon"})).status_code == 400


async def test_only_configured_plans_can_be_given(admin, usage):
    _, ada, _ = usage
    error = error_of(await admin.patch(f"/admin/users/{ada.id}", json={"plan": "gold"}), 400)
    assert (error["code"], error["param"]) == ("unknown_plan", "plan")
    assert "'gold'" in error["message"] and "free, pro" in error["message"]
    gold = {"email": "c@example.com", "plan": "gold"}
    error = error_of(await admin.post("/admin/users", json=gold), 400)
    assert error["code"] == "unknown_plan"
    moved = await admin.patch(f"/admin/users/{ada.id}", json={"plan": "pro"})
    assert moved.json()["plan"] == "pro"
