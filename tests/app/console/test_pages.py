"""The console's API keys and plan pages on a real store: the same keys the API accepts."""

import re
from datetime import timedelta

from app.accounts.keystore import keygen
from app.accounts.keystore.usage import UsageCount, UsageKey, today
from tests.app.console.conftest import Browser

_SECRET = re.compile(r'id="new-key-value">(sai-[A-Za-z0-9_-]+)<')


async def create_key(browser: Browser, name: str):
    return await browser.submit("/keys", "/keys", name=name)


async def test_a_new_key_is_shown_once_and_works_on_the_api(browser, store):
    await browser.sign_up("ada@example.com")
    created = await create_key(browser, "  laptop ")
    assert created.status_code == 201
    secret = _SECRET.search(created.text).group(1)
    assert keygen.is_well_formed(secret)
    [key] = (await store.list_keys("ada@example.com")).data
    assert (key.name, key.display) == ("laptop", keygen.display_form(secret))
    assert (
        await browser.client.get("/v1/models", headers={"Authorization": f"Bearer {secret}"})
    ).status_code == 200

    listed = await browser.get("/keys")
    assert secret not in listed.text and key.display in listed.text and "laptop" in listed.text
    assert listed.headers["cache-control"] == "no-store"


async def test_revoking_asks_first_then_the_api_refuses_the_key(browser, store):
    await browser.sign_up("ada@example.com")
    secret = _SECRET.search((await create_key(browser, "ci")).text).group(1)
    auth = {"Authorization": f"Bearer {secret}"}
    assert (await browser.client.get("/v1/models", headers=auth)).status_code == 200
    [key] = (await store.list_keys("ada@example.com")).data

    confirm = await browser.get(f"/keys/{key.id}/revoke")
    assert confirm.status_code == 200 and "Revoke this key" in confirm.text
    assert not (await store.list_keys("ada@example.com")).data[0].revoked

    done = await browser.submit(f"/keys/{key.id}/revoke", f"/keys/{key.id}/revoke")
    assert (done.status_code, done.headers["location"]) == (303, "/console/keys")
    page = await browser.get("/keys")
    assert "is revoked" in page.text and "Revoke…" not in page.text
    refused = await browser.client.get("/v1/models", headers=auth)
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]


async def test_another_users_key_cannot_be_revoked(browser, store):
    bob = await store.create_user("bob@example.com")
    bobs = await store.create_key(bob.id, "bob's")
    await browser.sign_up("ada@example.com")
    assert (await browser.get(f"/keys/{bobs.id}/revoke")).headers["location"] == "/console/keys"
    page = await browser.get("/keys")
    response = await browser.client.post(
        f"/console/keys/{bobs.id}/revoke",
        data={"csrf_token": re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)},
    )
    assert response.status_code == 404 and "No API key with id" in response.text
    assert not (await store.list_keys(bob.id)).data[0].revoked


async def test_a_rotated_key_is_replaced_and_the_old_one_works_for_the_hours_chosen(browser, store):
    await browser.sign_up("ada@example.com")
    old_secret = _SECRET.search((await create_key(browser, "ci")).text).group(1)
    [old] = (await store.list_keys("ada@example.com")).data
    page = (await browser.get("/keys")).text
    assert '<option value="24" selected>' in page and f"/keys/{old.id}/rotate" in page

    rotated = await browser.submit("/keys", f"/keys/{old.id}/rotate", grace_hours="1")
    assert rotated.status_code == 201
    assert f"“ci” (replaces <code>{old.display}</code>, which works 1 hour more)" in rotated.text
    new_secret = _SECRET.search(rotated.text).group(1)
    new, kept = (await store.list_keys("ada@example.com", order="desc")).data
    assert (new.name, kept.id, kept.revoked) == ("ci", old.id, False)
    for secret in (old_secret, new_secret):
        assert (
            await browser.client.get("/v1/models", headers={"Authorization": f"Bearer {secret}"})
        ).status_code == 200
    listed = (await browser.get("/keys")).text
    assert "rotated: works until" in listed
    assert listed.index(new.display) < listed.index(old.display)  # newest first

    now = await browser.submit("/keys", f"/keys/{new.id}/rotate", grace_hours="0")
    assert now.status_code == 201 and "now revoked" in now.text
    refused = await browser.client.get(
        "/v1/models", headers={"Authorization": f"Bearer {new_secret}"}
    )
    assert refused.status_code == 401


async def test_rotating_is_refused_for_another_users_key_or_an_unknown_grace(browser, store):
    bob = await store.create_user("bob@example.com")
    bobs = await store.create_key(bob.id, "bob's")
    await browser.sign_up("ada@example.com")
    await create_key(browser, "mine")
    [mine] = (await store.list_keys("ada@example.com")).data
    theirs = await browser.submit("/keys", f"/keys/{bobs.id}/rotate", grace_hours="24")
    assert theirs.status_code == 404 and "No API key with id" in theirs.text
    too_long = await browser.submit("/keys", f"/keys/{mine.id}/rotate", grace_hours="1000")
    assert too_long.status_code == 400 and "grace_hours" in too_long.text
    assert len((await store.list_keys(bob.id)).data) == 1
    assert [k.id for k in (await store.list_keys("ada@example.com")).data] == [mine.id]


async def test_key_names_and_the_key_limit_are_explained(browser, store):
    await browser.sign_up("ada@example.com")
    empty = await create_key(browser, "   ")
    assert empty.status_code == 400 and "Key name: is required." in empty.text
    long = await create_key(browser, "x" * 101)
    assert long.status_code == 400 and "Key name: must be at most 100 characters." in long.text
    for n in range(store.max_keys_per_user):
        assert (await create_key(browser, f"k{n}")).status_code == 201
    full = await create_key(browser, "one more")
    assert full.status_code == 409 and "Revoke one first" in full.text


async def test_the_quick_start_names_the_public_base_url_and_plan(browser):
    await browser.sign_up("ada@example.com")
    keys = await browser.get("/keys")
    assert 'base_url="http://127.0.0.1:8123/v1"' in keys.text
    assert 'os.environ["SERVICEAI_API_KEY"]' in keys.text
    assert "export OPENAI_BASE_URL=http://127.0.0.1:8123/v1 OPENAI_API_KEY=" in keys.text
    plan = await browser.get("/plan")
    assert 'Plan: <span class="plan">free</span>' in plan.text


async def test_the_plan_page_shows_todays_usage_against_the_plans_limits(browser, store):
    await browser.sign_up("ada@example.com")
    key = await store.create_key("ada@example.com", "laptop")
    yesterday = today() - timedelta(days=1)
    await store.record_usage(
        {
            UsageKey(key.id, "ServiceAi-Pro", today()): UsageCount(3, 30, 12),
            UsageKey(key.id, "ServiceAi-Pro", yesterday): UsageCount(100, 1000, 1000),
        }
    )
    page = (await browser.get("/plan")).text
    pro = page[page.index('data-model="ServiceAi-Pro"') :]
    pro = pro[: pro.index("</tr>")]
    # Today's 3 requests and 42 tokens, not yesterday's; the free plan's Pro limits.
    assert re.findall(r'<td class="number">([^<]+)</td>', pro)[:2] == ["3", "42"]
    assert "200,000" in pro and "10 requests<br>20,000 tokens" in pro
    fast = page[page.index('data-model="ServiceAi-Fast"') :]
    assert re.findall(r'<td class="number">([^<]+)</td>', fast)[:2] == ["0", "0"]
    assert "20,000,000" in fast[: fast.index("</tr>")]
    assert "Monthly budget" not in page
    # A monthly budget: what this month's usage took of it (yesterday's too, if this month).
    await store.update_user("ada@example.com", monthly_tokens=100_000)
    used = 42 + (2000 if yesterday.month == today().month else 0)
    page = (await browser.get("/plan")).text
    assert f"<strong>{used:,}</strong>\n    of 100,000 tokens used, {100_000 - used:,} left" in page


async def test_a_plan_the_service_does_not_offer_is_said_plainly(browser, store):
    await browser.sign_up("ada@example.com")
    await store.update_user("ada@example.com", plan="gold")
    page = await browser.get("/plan")
    assert page.status_code == 200 and "plan &#39;gold&#39; is not offered" in page.text
    assert "no limits configured" in page.text


async def test_security_headers_and_html_errors(browser):
    page = await browser.get("/sign-in")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    missing = await browser.get("/nowhere")
    assert missing.status_code == 404 and "There is no page at /console/nowhere" in missing.text
    assert missing.headers["content-type"].startswith("text/html")
    assert (await browser.get("/static/console.js")).status_code == 200
    root = await browser.client.get("/console/", follow_redirects=False)
    assert root.headers["location"] == "/console/sign-in"


async def test_the_key_form_takes_the_apis_scopes_and_the_list_shows_them(browser, store):
    await browser.sign_up("ada@example.com")
    later = (today() + timedelta(days=30)).isoformat()
    created = await browser.submit(
        "/keys",
        "/keys",
        name="scoped",
        models=["ServiceAi-Coder", "ServiceAi-Fast"],
        expires_on=later,
        tokens_per_minute="900",
        monthly_tokens="50000",
        requests_per_minute="",
        concurrent_requests="",
        tokens_per_day="",
    )
    assert created.status_code == 201, created.text
    [key] = (await store.list_keys("ada@example.com")).data
    assert key.models == ["ServiceAi-Coder", "ServiceAi-Fast"]
    assert key.expires_at.date().isoformat() == later and key.monthly_tokens == 50000
    assert key.limits.tokens_per_minute == 900 and key.limits.requests_per_minute is None
    page = (await browser.get("/keys")).text
    assert 'name="models" value="ServiceAi-Coder"' in page  # the form offers each type
    assert "ServiceAi-Coder, ServiceAi-Fast" in page and "50,000 tokens a month" in page
    assert "900 tokens per minute" in page and f"expires {later} 00:00 UTC" in page

    plain = await browser.submit("/keys", "/keys", name="plain")
    assert plain.status_code == 201 and "all of your plan" in plain.text

    for fields, message in (
        ({"tokens_per_day": "0"}, "Tokens per day"),
        ({"expires_on": today().isoformat()}, "Expires on"),
        ({"models": "GPT-9"}, "no model type"),
    ):
        refused = await browser.submit("/keys", "/keys", name="bad", **fields)
        assert refused.status_code == 400 and message in refused.text, refused.text
    assert len((await store.list_keys("ada@example.com")).data) == 2
