"""Signing in to the console: passwords, users made elsewhere, and the limit on attempts."""

from app.accounts.keystore import KeyStore
from tests.app.console.conftest import PASSWORD

WRONG = "The email or the password is not right."


async def test_sign_in_with_the_right_password_only(browser, new_browser):
    await browser.sign_up("ada@example.com")
    other = new_browser()
    wrong = await other.sign_in("ada@example.com", "not the password")
    assert wrong.status_code == 401 and WRONG in wrong.text
    # An unknown email gets the same answer: the form tells nobody who has an account.
    unknown = await other.sign_in("nobody@example.com")
    assert unknown.status_code == 401 and WRONG in unknown.text
    right = await other.sign_in("ADA@example.com ")
    assert (right.status_code, right.headers["location"]) == (303, "/console/keys")
    assert (await other.get("/keys")).status_code == 200


async def test_a_user_made_by_the_cli_signs_in_once_a_password_is_set(browser, store: KeyStore):
    await store.create_user("ops@example.com", plan="pro")
    assert (await browser.sign_in("ops@example.com")).status_code == 401
    # Signing up cannot take over the existing account.
    taken = await browser.sign_up("ops@example.com")
    assert taken.status_code == 409 and "already exists" in taken.text
    await store.set_password("ops@example.com", PASSWORD)
    assert (await browser.sign_in("ops@example.com")).status_code == 303
    assert "pro" in (await browser.get("/plan")).text


async def test_a_disabled_user_cannot_sign_in(browser, store):
    await store.create_user("ada@example.com", password=PASSWORD)
    await store.update_user("ada@example.com", disabled=True)
    response = await browser.sign_in("ada@example.com")
    assert response.status_code == 403 and "disabled" in response.text
    assert (await browser.get("/keys")).status_code == 303


async def test_sign_in_attempts_are_limited_per_email(browser, new_browser, store):
    await store.create_user("ada@example.com", password=PASSWORD)
    await store.create_user("bob@example.com", password=PASSWORD)
    for _ in range(3):  # the test settings: 3 a minute per email
        assert (await browser.sign_in("ada@example.com", "guess")).status_code == 401
    limited = await browser.sign_in("ada@example.com")  # even the right password, now
    assert limited.status_code == 429 and "Too many attempts" in limited.text
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    assert (await browser.get("/keys")).status_code == 303
    # Another email from the same address is still allowed.
    assert (await browser.sign_in("bob@example.com")).status_code == 303


async def test_sign_in_and_sign_up_attempts_are_limited_per_address(new_browser):
    browser = new_browser(sign_in_limit_per_address="2/minute")
    assert (await browser.sign_in("a@example.com")).status_code == 401
    assert (await browser.sign_up("b@example.com")).status_code == 303
    limited = await browser.sign_up("c@example.com")
    assert limited.status_code == 429 and "retry-after" in limited.headers


async def test_bad_forms_name_the_field(browser):
    short = await browser.sign_up("ada@example.com", "short")
    assert short.status_code == 400
    assert "Password: must be at least 10 characters (and at most 1024)." in short.text
    differ = await browser.submit(
        "/sign-up", "/sign-up", email="ada@example.com", password=PASSWORD, password_again="x"
    )
    assert differ.status_code == 400 and "The two passwords differ." in differ.text
    email = await browser.sign_up("not-an-email")
    assert email.status_code == 400 and "Email: is not an email address." in email.text
    assert PASSWORD not in short.text + differ.text + email.text
