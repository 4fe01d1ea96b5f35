"""The account console in Debian's Chromium (Playwright), served by the real stack.

Sign up, create a key, copy it with the page's button, call the API with it through the
`openai` client, revoke it, see the next call refused. Every page is photographed: under the
test's tmp dir, and the latest set in /tmp/helpers/console-shots/ for a person to look at.
"""

from __future__ import annotations

import time

import openai
import pytest
from playwright.sync_api import Browser, expect

from app.accounts.keystore import keygen
from tests.conftest import Stack
from tests.e2e.browser import Camera
from tests.e2e.test_keys import HI, wait_until_refused

PASSWORD = "a console password for e2e"


def test_sign_up_create_copy_call_rotate_revoke_refused(stack: Stack, chromium: Browser, tmp_path):
    stack.secrets.append(PASSWORD)
    context = chromium.new_context(
        permissions=["clipboard-read", "clipboard-write"], viewport={"width": 1200, "height": 800}
    )
    page = context.new_page()
    camera = Camera(page, tmp_path)
    try:
        page.goto(f"{stack.origin}/console/")
        expect(page).to_have_url(f"{stack.origin}/console/sign-in")
        camera.shoot("sign-in")

        page.get_by_role("link", name="Sign up").click()
        page.get_by_label("Email").fill("browser@example.com")
        page.get_by_label("Password", exact=False).first.fill(PASSWORD)
        page.get_by_label("Repeat password").fill(PASSWORD)
        camera.shoot("sign-up")
        page.get_by_role("button", name="Sign up").click()
        expect(page).to_have_url(f"{stack.origin}/console/keys")
        expect(page.get_by_text("No keys yet")).to_be_visible()
        expect(page.locator("#quick-start")).to_contain_text(f'base_url="{stack.base_url}"')
        camera.shoot("keys-empty")

        page.get_by_label("Name").fill("from the browser")
        page.get_by_role("button", name="Create key").click()
        shown = page.locator("#new-key-value").inner_text()
        page.locator("button[data-copy=new-key-value]").click()
        expect(page.locator("button[data-copy=new-key-value]")).to_have_text("Copied")
        copied = page.evaluate("navigator.clipboard.readText()")
        stack.secrets.append(copied)
        assert copied == shown and keygen.is_well_formed(copied)
        camera.shoot("key-created")

        client = openai.OpenAI(base_url=stack.base_url, api_key=copied, max_retries=0)
        reply = client.chat.completions.create(model="ServiceAi-Fast", messages=HI, max_tokens=4)
        assert reply.choices[0].message.role == "assistant"

        page.get_by_role("link", name="API keys").click()
        row = page.locator("tr", has_text="from the browser")
        expect(row).to_contain_text(keygen.display_form(copied))
        assert copied not in page.content()
        row.get_by_label("The old key works for").select_option("0")
        row.get_by_role("button", name="Rotate").click()
        expect(page.locator("#new-key-title")).to_contain_text("now revoked")
        rotated = page.locator("#new-key-value").inner_text()
        stack.secrets.append(rotated)
        assert keygen.is_well_formed(rotated) and rotated != copied
        camera.shoot("key-rotated")
        with pytest.raises(openai.AuthenticationError):
            wait_until_refused(client, timeout_s=stack.key_cache_ttl_s + 5)
        client = openai.OpenAI(base_url=stack.base_url, api_key=rotated, max_retries=0)
        reply = client.chat.completions.create(model="ServiceAi-Fast", messages=HI, max_tokens=4)
        assert reply.choices[0].message.role == "assistant"

        page.get_by_role("link", name="API keys").click()
        row = page.locator("tr", has_text=keygen.display_form(rotated))
        row.get_by_role("link", name="Revoke…").click()
        expect(page.get_by_role("heading")).to_contain_text("Revoke key “from the browser”?")
        camera.shoot("revoke-confirm")
        page.get_by_role("button", name="Revoke this key").click()
        expect(page.get_by_role("status")).to_contain_text("is revoked")
        expect(page.locator("tr", has_text=keygen.display_form(rotated))).to_contain_text("revoked")
        camera.shoot("key-revoked")

        # One ingress replica here refuses at once; more would within the key cache TTL.
        with pytest.raises(openai.AuthenticationError) as refused:
            wait_until_refused(client, timeout_s=stack.key_cache_ttl_s + 5)
        assert refused.value.status_code == 401 and "revoked" in refused.value.body["message"]

        page.get_by_role("link", name="Plan and usage").click()
        expect(page.get_by_role("heading", name="Plan: free")).to_be_visible()
        # The two calls above, once the replica has written their usage (every second here).
        fast_requests = page.locator('tr[data-model="ServiceAi-Fast"] td.number').first
        deadline = time.monotonic() + 30
        while fast_requests.inner_text() != "2" and time.monotonic() < deadline:
            time.sleep(1)
            page.reload()
        assert fast_requests.inner_text() == "2"
        expect(page.locator('tr[data-model="ServiceAi-Pro"]')).to_contain_text("200,000")
        camera.shoot("plan")

        page.get_by_role("button", name="Sign out").click()
        expect(page).to_have_url(f"{stack.origin}/console/sign-in")
        page.goto(f"{stack.origin}/console/keys")
        expect(page).to_have_url(f"{stack.origin}/console/sign-in")
    finally:
        camera.publish()
        context.close()


def test_a_wrong_password_is_refused_in_the_browser(stack: Stack, chromium: Browser, tmp_path):
    page = chromium.new_page()
    camera = Camera(page, tmp_path, first=20)
    try:
        page.goto(f"{stack.origin}/console/sign-in")
        page.get_by_label("Email").fill("e2e@serviceai.test")
        page.get_by_label("Password").fill("not the password at all")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_have_text("The email or the password is not right.")
        camera.shoot("sign-in-refused")
    finally:
        camera.publish()
        page.close()


def test_a_key_scoped_in_the_console_calls_only_its_type(stack: Stack, chromium: Browser, tmp_path):
    """The key form's scopes (the API's): one model type, a monthly budget; the list shows them
    and the key is held to them."""
    stack.secrets.append(PASSWORD)
    context = chromium.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    camera = Camera(page, tmp_path, first=20)
    try:
        page.goto(f"{stack.origin}/console/sign-up")
        page.get_by_label("Email").fill("scoped@example.com")
        page.get_by_label("Password", exact=False).first.fill(PASSWORD)
        page.get_by_label("Repeat password").fill(PASSWORD)
        page.get_by_role("button", name="Sign up").click()
        expect(page).to_have_url(f"{stack.origin}/console/keys")

        page.get_by_label("Name").fill("coder only")
        page.get_by_text("Scopes (optional)").click()
        page.get_by_label("ServiceAi-Coder").check()
        page.get_by_label("Tokens per month").fill("50000")
        page.get_by_label("Requests per minute").fill("7")
        camera.shoot("key-scopes-form")
        page.get_by_role("button", name="Create key").click()
        secret = page.locator("#new-key-value").inner_text()
        stack.secrets.append(secret)
        row = page.locator("tr", has_text="coder only")
        expect(row).to_contain_text("ServiceAi-Coder")
        expect(row).to_contain_text("50,000 tokens a month")
        expect(row).to_contain_text("7 requests per minute")
        camera.shoot("key-scoped")

        client = openai.OpenAI(base_url=stack.base_url, api_key=secret, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["ServiceAi-Coder"]
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(model="ServiceAi-Fast", messages=HI, max_tokens=2)

        page.get_by_label("Name").fill("bad")
        page.get_by_text("Scopes (optional)").click()
        page.get_by_label("Tokens per day").fill("0")
        page.get_by_label("Tokens per day").evaluate("e => e.removeAttribute('min')")
        page.get_by_role("button", name="Create key").click()
        expect(page.get_by_role("alert")).to_contain_text("Tokens per day")
    finally:
        camera.publish()
        context.close()
