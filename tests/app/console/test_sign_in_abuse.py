"""Sign-in and sign-up abuse: whose address a limit counts, a lockout that others cannot
cause, and sign-up that tells nobody which emails have accounts. One real key store, SQLite and
PostgreSQL; each `new_browser()` talks to the console from 127.0.0.1."""

from __future__ import annotations

from app.accounts.keystore import KeyStore
from tests.app.console.conftest import PASSWORD, csrf_of


def behind(browser, *forwarded: str):
    browser.client.headers["X-Forwarded-For"] = ", ".join(forwarded)
    return browser


async def test_without_trusted_proxies_a_forged_x_forwarded_for_changes_nothing(new_browser):
    browser = new_browser(sign_in_limit_per_address="2/minute")
    for forged in ("203.0.113.1", "203.0.113.2"):
        assert (await behind(browser, forged).sign_in("a@example.com")).status_code == 401
    assert (await behind(browser, "203.0.113.3").sign_in("a@example.com")).status_code == 429


async def test_behind_a_trusted_proxy_each_browser_is_limited_apart(new_browser):
    """31 bad sign-ins from one browser behind the load balancer lock out that browser only."""
    proxy = new_browser(sign_in_limit_per_address="2/minute", trusted_proxies=["127.0.0.0/8"])
    for _ in range(2):
        # The browser's own header is to the left: the proxy appended the address it saw.
        behind(proxy, "198.51.100.9", "203.0.113.7")
        assert (await proxy.sign_in("a@example.com")).status_code == 401
    assert (await proxy.sign_in("a@example.com")).status_code == 429
    behind(proxy, "203.0.113.8")  # another browser, same proxy
    assert (await proxy.sign_in("a@example.com")).status_code == 401


async def test_attempts_refused_per_address_do_not_lock_the_email_out(new_browser, store):
    await store.create_user("ada@example.com", password=PASSWORD)
    attacker = new_browser(sign_in_limit_per_address="2/minute", trusted_proxies=["127.0.0.1"])
    behind(attacker, "203.0.113.66")
    statuses = [(await attacker.sign_in("ada@example.com", "guess")).status_code for _ in range(10)]
    assert statuses == [401, 401] + [429] * 8
    # The per-email limit (3 a minute) saw 2 attempts, not 10: Ada, from her own address, still
    # signs in (on the same replica, whose limiter counted them).
    owner = behind(attacker, "198.51.100.20")
    assert (await owner.sign_in("ada@example.com")).headers["location"] == "/console/keys"


async def test_sign_up_by_approval_answers_every_email_alike(new_browser, store: KeyStore):
    await store.create_user("ada@example.com", password=PASSWORD)
    browser = new_browser(sign_up="approval")
    taken = await browser.sign_up("ada@example.com", "another password!")
    new = await browser.sign_up("bob@example.com")
    assert taken.status_code == new.status_code == 202
    assert taken.text.replace("ada@", "X@") == new.text.replace("bob@", "X@")
    assert "operator of this service will enable" in new.text
    # Nothing changed for Ada; Bob waits for an operator, then signs in.
    assert (await browser.sign_in("ada@example.com")).headers["location"] == "/console/keys"
    other = new_browser(sign_up="approval")
    assert (await other.sign_in("bob@example.com")).status_code == 403
    await store.update_user("bob@example.com", disabled=False)  # `serviceai users enable`
    assert (await other.sign_in("bob@example.com")).headers["location"] == "/console/keys"


async def test_sign_up_can_be_turned_off(new_browser, store: KeyStore):
    browser = new_browser(sign_up="off")
    page = await browser.get("/sign-up")
    assert "does not take sign-ups" in page.text and 'action="/console/sign-up"' not in page.text
    assert "Sign up</a>" not in (await browser.get("/sign-in")).text
    token_page = await browser.get("/sign-in")
    refused = await browser.client.post(
        "/console/sign-up",
        data={
            "csrf_token": csrf_of(token_page),
            "email": "eve@example.com",
            "password": PASSWORD,
            "password_again": PASSWORD,
        },
    )
    assert refused.status_code == 403
    assert (await store.list_users()).data == []


async def test_a_trusted_proxy_that_names_nobody_counts_against_the_shared_ceiling(new_browser):
    """Behind a trusted proxy with no X-Forwarded-For the address is unknowable: those attempts
    share a ceiling sized to hashing work, not one browser's 2 a minute."""
    proxy = new_browser(
        sign_in_limit_per_address="2/minute",
        sign_in_limit_shared="4/minute",
        trusted_proxies=["127.0.0.1"],
    )
    statuses = [(await proxy.sign_in(f"{n}@example.com")).status_code for n in range(5)]
    assert statuses == [401] * 4 + [429]
    # A browser the proxy names is still its own.
    assert (await behind(proxy, "203.0.113.9").sign_in("b@example.com")).status_code == 401
