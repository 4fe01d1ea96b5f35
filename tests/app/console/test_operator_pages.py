"""The operator's pages under /console/admin on a real store: refused to everyone else, every
action audited, usage over time as a chart, a table and a CSV."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.routing import APIRoute
from starlette.routing import Mount

from app.accounts.keystore import KeyStore
from app.accounts.keystore.usage import UsageCount, UsageKey, today
from tests.app.console.conftest import PASSWORD, Browser, csrf_of

_SECRET = re.compile(r'id="new-key-value">(sai-[A-Za-z0-9_-]+)<')
REFUSED = "This page is for the operators of this service only."


def operator_routes(browser: Browser) -> list[tuple[str, str]]:
    """(method, path) of every route of the console under /admin, as the app declares them."""
    [console] = [r.app for r in browser.app.routes if isinstance(r, Mount) and r.path == "/console"]
    return sorted(
        (method, route.path)
        for route in console.routes
        if isinstance(route, APIRoute) and route.path.startswith("/admin")
        for method in route.methods - {"HEAD"}
    )


async def operator(browser: Browser, store: KeyStore, email: str = "root@example.com") -> None:
    await browser.sign_up(email)
    await store.update_user(email, role="admin")


async def test_every_operator_page_and_action_is_refused_to_a_user(browser, store):
    victim = await store.create_user("bob@example.com")
    key = await store.create_key(victim.id, "bob's")
    await browser.sign_up("ada@example.com")
    routes = operator_routes(browser)
    # The listing is the app's own: a page added later is in it without changing this test.
    assert {
        ("GET", "/admin/users"),
        ("GET", "/admin/users/{user_id}"),
        ("GET", "/admin/keys"),
        ("GET", "/admin/plans"),
        ("GET", "/admin/usage"),
        ("GET", "/admin/usage.csv"),
        ("GET", "/admin/audit"),
        ("POST", "/admin/users"),
        ("GET", "/admin/keys/{key_id}/revoke"),
        ("POST", "/admin/keys/{key_id}/revoke"),
    } <= set(routes)
    token = csrf_of(await browser.get("/keys"))
    for method, path in routes:
        url = "/console" + path.format(user_id=victim.id, key_id=key.id)
        data = (
            {
                "csrf_token": token,
                "plan": "pro",
                "role": "admin",
                "email": "eve@example.com",
                "name": "x",
            }
            if method == "POST"
            else None
        )
        response = await browser.client.request(method, url, data=data)
        assert response.status_code == 403, (method, path)
        assert REFUSED in response.text and "<h1>403</h1>" in response.text, (method, path)
    assert (await store.get_user(victim.id)).plan == "free"
    assert not (await store.list_keys(victim.id)).data[0].revoked
    assert (await store.audit_log()).data == []


async def test_a_visitor_is_sent_to_sign_in_and_a_lost_role_takes_effect_at_once(browser, store):
    assert (await browser.get("/admin/users")).headers["location"] == "/console/sign-in"
    await operator(browser, store)
    assert (await browser.get("/admin/users")).status_code == 200
    await store.update_user("root@example.com", role="user")
    assert (await browser.get("/admin/users")).status_code == 403


async def test_an_operator_manages_a_user_and_their_keys_and_each_action_is_audited(browser, store):
    await operator(browser, store)
    created = await browser.submit(
        "/admin/users", "/admin/users", email="Ada@Example.com", plan="free", password=PASSWORD
    )
    ada = await store.get_user("ada@example.com")
    assert created.headers["location"] == f"/console/admin/users/{ada.id}"
    page = f"/admin/users/{ada.id}"
    assert "User ada@example.com is created on the free plan." in (await browser.get(page)).text

    found = await browser.get("/admin/users?q=ADA@")
    assert f'data-user-id="{ada.id}"' in found.text and "root@example.com</a>" not in found.text

    await browser.submit(page, f"{page}/plan", plan="pro")
    await browser.submit(page, f"{page}/disable")
    assert (await store.get_user(ada.id)).disabled
    await browser.submit(page, f"{page}/enable")
    await browser.submit(page, f"{page}/role", role="admin")
    ada = await store.get_user(ada.id)
    assert (ada.plan, ada.disabled, ada.role) == ("pro", False, "admin")

    issued = await browser.submit(
        page, f"{page}/keys", name="ci", models="ServiceAi-Fast", tokens_per_day="5000"
    )
    assert issued.status_code == 201
    secret = _SECRET.search(issued.text).group(1)
    [key] = (await store.list_keys(ada.id)).data
    assert (key.models, key.limits.tokens_per_day) == (["ServiceAi-Fast"], 5000)
    auth = {"Authorization": f"Bearer {secret}"}
    assert (await browser.client.get("/v1/models", headers=auth)).status_code == 200
    assert secret not in (await browser.get(page)).text  # shown once

    rotated = await browser.submit("/admin/keys", f"/admin/keys/{key.id}/rotate")
    assert rotated.status_code == 201 and "works 24 hours more" in rotated.text
    new_secret = _SECRET.search(rotated.text).group(1)
    assert new_secret != secret
    new_key = next(k for k in (await store.list_keys(ada.id)).data if k.id != key.id)
    # Revoking asks once more, naming the key and its owner; asking changes nothing.
    confirm = await browser.get(f"/admin/keys/{new_key.id}/revoke")
    assert confirm.status_code == 200 and new_key.display in confirm.text
    assert "ada@example.com" in confirm.text and "This cannot be" in confirm.text
    assert not (await store.get_key(new_key.id)).revoked
    revoked = await browser.submit(
        f"/admin/keys/{new_key.id}/revoke", f"/admin/keys/{new_key.id}/revoke"
    )
    assert revoked.headers["location"] == f"/console/admin/users/{ada.id}"
    again = await browser.get(f"/admin/keys/{new_key.id}/revoke")  # nothing left to confirm
    assert again.headers["location"] == f"/console/admin/users/{ada.id}"
    refused = await browser.client.get(
        "/v1/models", headers={"Authorization": f"Bearer {new_secret}"}
    )
    assert refused.status_code == 401

    listed = await browser.get(f"/admin/keys?user={ada.email}")
    assert listed.text.count("data-key-id=") == 2 and "ada@example.com" in listed.text

    audit = (await browser.get("/admin/audit")).text
    actions = re.findall(r'data-action="([^"]+)" data-target="([^"]+)"', audit)
    assert actions == [
        ("key.revoke", new_key.id),
        ("key.rotate", key.id),
        ("key.create", key.id),
        ("user.set_role", ada.email),
        ("user.enable", ada.email),
        ("user.disable", ada.email),
        ("user.set_plan", ada.email),
        ("user.create", ada.email),
    ]
    entries = (await store.audit_log()).data
    assert {(e.source, e.actor) for e in entries} == {("console", "root@example.com")}


async def test_users_and_keys_are_listed_newest_first_fifty_a_page(browser, store):
    await operator(browser, store)  # the first user
    users = [await store.create_user(f"u{i:02d}@example.com") for i in range(50)]
    keys = [await store.create_key(users[i % 50].id, f"k{i}") for i in range(51)]

    def ids(html: str, kind: str) -> list[str]:
        return re.findall(rf'data-{kind}-id="([^"]+)"', html)

    first = (await browser.get("/admin/users")).text
    assert ids(first, "user") == [u.id for u in reversed(users)]
    assert f"after={users[0].id}" in first  # the next page: the operator, the oldest
    last = (await browser.get(f"/admin/users?after={users[0].id}")).text
    assert ids(last, "user") == [(await store.get_user("root@example.com")).id]
    assert "Next" not in last
    newest = (await browser.get("/admin/keys")).text
    assert ids(newest, "key") == [k.id for k in keys[:0:-1]]
    assert ids((await browser.get(f"/admin/keys?after={keys[1].id}")).text, "key") == [keys[0].id]


async def test_forms_without_the_csrf_token_change_nothing(browser, store):
    await operator(browser, store)
    ada = await store.create_user("ada@example.com")
    response = await browser.client.post(
        f"/console/admin/users/{ada.id}/plan", data={"plan": "pro"}
    )
    assert response.status_code == 403 and "did not come from this console" in response.text
    assert (await store.get_user(ada.id)).plan == "free"
    assert (await store.audit_log()).data == []


@pytest.mark.parametrize(
    "bad",
    [
        "/admin/users/user_nope",
        "/admin/usage?days=14",
        "/admin/audit?before=x",
        f"/admin/audit?before={2**63}",
        "/admin/audit?before=\u00b2",
        f"/admin/usage?days={10**30}",
    ],
)
async def test_wrong_addresses_are_explained_on_the_consoles_error_page(browser, store, bad):
    await operator(browser, store)
    response = await browser.get(bad)
    assert response.status_code in (400, 404) and 'class="error"' in response.text


@pytest.mark.parametrize(
    ("hours", "said"), [("1", "which works 1 hour more"), ("0", "now revoked")]
)
async def test_the_operator_chooses_how_long_a_rotated_key_keeps_working(
    browser, store, hours, said
):
    await operator(browser, store)
    ada = await store.create_user("ada@example.com")
    key = await store.create_key(ada.id)
    page = (await browser.get(f"/admin/users/{ada.id}")).text
    assert '<option value="24" selected>' in page and '<option value="0">' in page
    started = datetime.now(UTC)
    rotated = await browser.submit("/admin/keys", f"/admin/keys/{key.id}/rotate", grace_hours=hours)
    assert rotated.status_code == 201 and said in rotated.text
    old = await store.get_key(key.id)
    ends = datetime.fromtimestamp(old.revoked_at, UTC)
    assert abs((ends - started).total_seconds() - 3600 * int(hours)) < 60
    assert old.revoked is (hours == "0")


@pytest.mark.parametrize("hours", [str(31 * 24), str(10**30), "-1", "\u00b2"])
async def test_a_grace_period_out_of_range_is_refused_and_the_key_kept(browser, store, hours):
    await operator(browser, store)
    ada = await store.create_user("ada@example.com")
    key = await store.create_key(ada.id)
    refused = await browser.submit("/admin/keys", f"/admin/keys/{key.id}/rotate", grace_hours=hours)
    assert refused.status_code == 400 and "grace_hours" in refused.text
    assert [k.id for k in (await store.list_keys(ada.id)).data] == [key.id]


async def test_plans_show_their_limits_and_how_many_users_each_has(browser, store):
    await operator(browser, store)
    for n in range(3):
        await store.create_user(f"u{n}@example.com", "pro")
    page = (await browser.get("/admin/plans")).text
    assert re.search(
        r'data-plan="pro">\s*<h2><span class="plan">pro</span>: '
        r'<span class="count">3</span> users',
        page,
    )
    assert re.search(r'<span class="count">1</span> user</h2>', page)  # the operator, on free
    assert "ServiceAi-Coder" in page


async def used(store: KeyStore, key_id: str, model: str, requests: int, tokens: int, days_ago=0):
    day = today() - timedelta(days=days_ago)
    await store.record_usage({UsageKey(key_id, model, day): UsageCount(requests, tokens, tokens)})


async def test_usage_over_time_as_a_chart_a_table_and_a_csv(browser, store):
    await operator(browser, store)
    ada = await store.create_user("ada@example.com")
    bob = await store.create_user("bob@example.com")
    ada_key = await store.create_key(ada.id, "ada-ci")
    bob_key = await store.create_key(bob.id, "bob-ci")
    await used(store, ada_key.id, "ServiceAi-Fast", 3, 100)
    await used(store, ada_key.id, "ServiceAi-Pro", 1, 10, days_ago=2)
    await used(store, bob_key.id, "ServiceAi-Fast", 2, 5)
    await used(store, bob_key.id, "ServiceAi-Fast", 9, 9, days_ago=20)  # outside 7 days

    page = (await browser.get("/admin/usage?days=7")).text
    day = today().isoformat()
    assert f"<title>{day} ServiceAi-Fast: 210 tokens</title>" in page
    assert f"<title>{day} ServiceAi-Fast: 5 requests</title>" in page
    assert "<script" not in page.split("</head>")[1]
    assert page.index("ada@example.com</a>") < page.index("bob@example.com</a>")  # top users
    assert "<strong>6</strong> requests" in page

    csv = await browser.get("/admin/usage.csv?days=7")
    assert csv.headers["content-type"] == "text/csv; charset=utf-8"
    two_days_ago = (today() - timedelta(days=2)).isoformat()
    assert csv.text == (
        "date,model,requests,prompt_tokens,completion_tokens,total_tokens\n"
        f"{two_days_ago},ServiceAi-Pro,1,10,10,20\n"
        f"{day},ServiceAi-Fast,5,105,105,210\n"
    )
    month = (await browser.get("/admin/usage.csv?days=30")).text
    assert month.count("\n") == 4

    user_page = (await browser.get(f"/admin/users/{ada.id}")).text
    assert f"<title>{day} ServiceAi-Fast: 200 tokens</title>" in user_page
    assert "bob@example.com" not in user_page


async def test_a_users_plan_page_draws_their_last_30_days_per_model_type(browser, store):
    await browser.sign_up("ada@example.com")
    other = await store.create_user("bob@example.com")
    mine = await store.create_key("ada@example.com", "mine")
    theirs = await store.create_key(other.id, "theirs")
    await used(store, mine.id, "ServiceAi-Coder", 4, 50, days_ago=29)
    await used(store, theirs.id, "ServiceAi-Coder", 7, 70, days_ago=1)
    await used(store, mine.id, "ServiceAi-Coder:acme", 1, 30, days_ago=29)  # a LoRA adapter's
    page = (await browser.get("/plan")).text
    assert page.count('<div class="model-chart"') == 3
    start = (today() - timedelta(days=29)).isoformat()
    assert f"<title>{start} ServiceAi-Coder: 100 tokens</title>" in page
    assert f"<title>{start} ServiceAi-Coder:acme: 60 tokens</title>" in page
    assert "140 tokens" not in page
    assert "Operator</a>" not in page
