"""Console sessions: signed HttpOnly cookies, and a CSRF token that every form must carry."""

import httpx
import pytest

from app.console import SESSION_COOKIE
from tests.app.console.conftest import PASSWORD, csrf_of


def session_cookie(response: httpx.Response) -> str:
    [cookie] = [c for c in response.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE)]
    return cookie


async def test_signing_up_starts_a_session_in_an_httponly_lax_cookie(browser, store):
    response = await browser.sign_up("ada@example.com")
    assert (response.status_code, response.headers["location"]) == (303, "/console/keys")
    cookie = session_cookie(response).lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and "path=/console" in cookie
    assert "secure" not in cookie  # http://127.0.0.1: a Secure cookie would never come back
    page = await browser.get("/keys")
    assert page.status_code == 200 and "ada@example.com" in page.text
    assert (await store.check_password("ada@example.com", PASSWORD)).plan == "free"


async def test_the_cookie_is_secure_when_the_public_url_is_https(new_browser):
    browser = new_browser(public_base_url="https://api.example.com/v1")
    cookie = session_cookie(await browser.sign_up("ada@example.com")).lower()
    assert "; secure" in cookie


async def test_pages_need_a_session(browser):
    for path in ("/keys", "/plan", "/keys/key_x/revoke"):
        response = await browser.get(path)
        assert (response.status_code, response.headers["location"]) == (303, "/console/sign-in")


async def test_a_tampered_or_foreign_cookie_is_no_session(browser, new_browser, store):
    await browser.sign_up("ada@example.com")
    value = browser.client.cookies[SESSION_COOKIE]
    assert (await browser.get("/keys")).status_code == 200
    # Another user id in the payload, with the old signature: the signature no longer matches.
    payload, _, signature = value.partition(".")
    forged = payload.replace(payload[5], "A" if payload[5] != "A" else "B", 1)
    for cookie in (f"{forged}.{signature}", value[:-2] + ("AA" if value[-2:] != "AA" else "BB")):
        browser.client.cookies.clear()
        browser.client.cookies.set(SESSION_COOKIE, cookie, domain="127.0.0.1", path="/console")
        assert (await browser.get("/keys")).status_code == 303

    # The same cookie signed with another secret (another deployment) is refused too.
    other = new_browser(session_secret="o" * 40)
    other.client.cookies.set(SESSION_COOKIE, value, domain="127.0.0.1", path="/console")
    assert (await other.get("/keys")).status_code == 303


async def test_a_rotated_secret_keeps_sessions_signed_with_the_previous_one(new_browser):
    """Rotation without signing anyone out: the new secret beside the previous one reads a
    session the previous one signed, and signs it again with the new one; once the previous
    one is gone, only sessions signed again still hold."""
    old, new = "o" * 40, "n" * 40
    before = new_browser(session_secret=old)
    await before.sign_up("ada@example.com")
    signed_before = before.client.cookies[SESSION_COOKIE]

    during = new_browser(session_secret=new, session_secret_previous=old)
    during.client.cookies.set(SESSION_COOKIE, signed_before, domain="127.0.0.1", path="/console")
    page = await during.get("/keys")
    assert page.status_code == 200 and "ada@example.com" in page.text
    signed_again = during.client.cookies[SESSION_COOKIE]
    assert signed_again != signed_before

    after = new_browser(session_secret=new)
    for cookie, status in ((signed_again, 200), (signed_before, 303)):
        after.client.cookies.clear()
        after.client.cookies.set(SESSION_COOKIE, cookie, domain="127.0.0.1", path="/console")
        assert (await after.get("/keys")).status_code == status


async def test_signing_out_ends_the_session(browser):
    await browser.sign_up("ada@example.com")
    response = await browser.submit("/keys", "/sign-out")
    assert (response.status_code, response.headers["location"]) == (303, "/console/sign-in")
    assert (await browser.get("/keys")).status_code == 303


@pytest.mark.parametrize(
    "action, fields",
    [
        (
            "/sign-up",
            {"email": "eve@example.com", "password": PASSWORD, "password_again": PASSWORD},
        ),
        ("/sign-in", {"email": "ada@example.com", "password": PASSWORD}),
        ("/sign-out", {}),
        ("/keys", {"name": "forged"}),
    ],
)
async def test_every_form_refuses_a_post_without_this_sessions_token(
    browser, new_browser, store, action, fields
):
    await browser.sign_up("ada@example.com")
    # Another visitor's valid token (as a cross-site page could get its own) is not this one's.
    foreign = csrf_of(await new_browser().get("/sign-in"))
    for token in (None, "", foreign):
        data = fields if token is None else {"csrf_token": token, **fields}
        response = await browser.client.post(f"/console{action}", data=data)
        assert response.status_code == 403, (action, token)
        assert "did not come from this console" in response.text
    # Nothing happened: no user, no key, still signed in.
    assert [u.email for u in (await store.list_users()).data] == ["ada@example.com"]
    assert (await store.list_keys("ada@example.com")).data == []
    assert (await browser.get("/keys")).status_code == 200


async def test_revoking_needs_the_token_too(browser, store):
    await browser.sign_up("ada@example.com")
    key = await store.create_key("ada@example.com", "laptop")
    response = await browser.client.post(f"/console/keys/{key.id}/revoke", data={"name": "x"})
    assert response.status_code == 403
    assert not (await store.list_keys("ada@example.com")).data[0].revoked


async def test_a_session_of_a_disabled_user_ends(browser, store):
    await browser.sign_up("ada@example.com")
    await store.update_user("ada@example.com", disabled=True)
    assert (await browser.get("/keys")).status_code == 303
    await store.update_user("ada@example.com", disabled=False)
    assert (await browser.get("/keys")).status_code == 303  # signed out: sign in again
