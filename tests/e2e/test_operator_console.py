"""The operator's console in Debian's Chromium (Playwright), served by the real stack.

An operator (made one with the CLI) creates a user, sets a plan, creates a key, sees the
requests made with it on the usage charts once the replica has written them, revokes it and
finds each action in the audit log; the user gets the 403 page on every operator URL and
action (listed from the app's routes) and sees their requests on their own chart. Every page is
photographed as in test_console.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai
import pytest
from playwright.sync_api import Browser, Page, expect

from app.console import operator_pages
from tests.conftest import Stack
from tests.e2e.browser import Camera
from tests.e2e.conftest import serviceai_cli
from tests.e2e.test_keys import HI, wait_until_refused

OPERATOR = "operator@example.com"
CUSTOMER = "customer@example.com"
PASSWORD = "an operator's console password"
REFUSED = "This page is for the operators of this service only."


def set_password(stack: Stack, email: str) -> None:
    env = {**os.environ, "SERVICEAI_DATABASE_URL": stack.database_url}
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("serviceai")),
            "users",
            "set-password",
            email,
            "--password-stdin",
        ],
        input=PASSWORD + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def wait_for_usage(stack: Stack, key_id: str, requests: int, timeout_s: float = 30) -> None:
    """Until the key store holds `requests` requests of this key (the replica writes every
    SERVICEAI_USAGE_FLUSH_S)."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {stack.admin_token}"}
    while True:
        usage = httpx.get(
            f"{stack.origin}/admin/usage", params={"key_id": key_id}, headers=headers, timeout=10
        ).json()
        if sum(row["requests"] for row in usage["data"]) >= requests:
            return
        assert time.monotonic() < deadline, f"usage of {key_id} not written: {usage}"
        time.sleep(0.2)  # a poll interval: the wait is on the condition above


def sign_in(page: Page, stack: Stack, email: str) -> None:
    page.goto(f"{stack.origin}/console/sign-in")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{stack.origin}/console/keys")


def test_an_operator_runs_the_service_from_the_browser(
    stack: Stack,
    chromium: Browser,
    tmp_path,  # noqa: F811
):
    stack.secrets.append(PASSWORD)
    serviceai_cli(stack.database_url, "users", "create", "--email", OPERATOR, "--json")
    set_password(stack, OPERATOR)
    made = serviceai_cli(stack.database_url, "users", "set-role", OPERATOR, "admin", "--json")
    assert made["role"] == "admin"
    today = datetime.now(UTC).date().isoformat()

    context = chromium.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    camera = Camera(page, tmp_path / "operator", first=40)
    camera.folder.mkdir()
    try:
        sign_in(page, stack, OPERATOR)
        page.get_by_role("link", name="Operator").click()
        expect(page).to_have_url(f"{stack.origin}/console/admin/users")
        camera.shoot("admin-users")

        page.get_by_label("Email", exact=True).fill(CUSTOMER)
        page.get_by_label("Console password").fill(PASSWORD)
        page.get_by_role("button", name="Create user").click()
        expect(page.get_by_role("status")).to_contain_text(f"User {CUSTOMER} is created")
        user_url = page.url
        page.get_by_label("Plan").select_option("pro")
        page.get_by_role("button", name="Set plan").click()
        expect(page.get_by_role("status")).to_contain_text("is now on the pro plan")
        camera.shoot("admin-user")

        page.get_by_label("Name").fill("operator-made")
        page.get_by_role("button", name="Create key").click()
        secret = page.locator("#new-key-value").inner_text()
        stack.secrets.append(secret)
        row = page.locator("tr[data-key-id]", has_text="operator-made")
        key_id = row.get_attribute("data-key-id")
        camera.shoot("admin-key-created")

        client = openai.OpenAI(base_url=stack.base_url, api_key=secret, max_retries=0)
        tokens = 0
        for _ in range(2):
            reply = client.chat.completions.create(
                model="ServiceAi-Fast", messages=HI, max_tokens=4
            )
            tokens += reply.usage.total_tokens
        wait_for_usage(stack, key_id, 2)

        page.goto(user_url)
        expect(
            page.locator("svg rect title", has_text=f"{today} ServiceAi-Fast: 2 requests")
        ).to_have_count(1)
        expect(
            page.locator("svg rect title", has_text=f"{today} ServiceAi-Fast: {tokens:,} tokens")
        ).to_have_count(1)
        expect(page.locator(f'table.top-keys tr[data-key-id="{key_id}"]')).to_contain_text("2")
        camera.shoot("admin-user-usage")

        page.goto(f"{stack.origin}/console/admin/usage?days=7")
        # The whole service's usage: other tests' keys may outrank this one among the top
        # keys, so the day's ServiceAi-Fast figures are checked to hold its requests.
        expect(page.locator("svg rect title", has_text=f"{today} ServiceAi-Fast:")).to_have_count(2)
        expect(page.locator("table.top-keys tr[data-key-id]").first).to_be_visible()
        with page.expect_download() as download:
            page.get_by_role("link", name="usage.csv").click()
        csv = Path(download.value.path()).read_text()
        assert csv.startswith("date,model,requests,prompt_tokens,completion_tokens,total_tokens\n")
        [fast_today] = [
            line.split(",")
            for line in csv.splitlines()
            if line.startswith(f"{today},ServiceAi-Fast,")
        ]
        assert int(fast_today[2]) >= 2 and int(fast_today[5]) >= tokens
        camera.shoot("admin-usage")

        page.goto(user_url)
        page.locator("tr[data-key-id]", has_text="operator-made").get_by_role(
            "link", name="Revoke…"
        ).click()
        expect(page.get_by_role("heading", level=1)).to_contain_text(CUSTOMER)
        camera.shoot("admin-key-revoke")
        page.get_by_role("button", name="Revoke this key").click()
        expect(page.get_by_role("status")).to_contain_text("is revoked")
        camera.shoot("admin-key-revoked")
        with pytest.raises(openai.AuthenticationError):
            wait_until_refused(client, timeout_s=stack.key_cache_ttl_s + 5)

        page.get_by_role("link", name="Keys", exact=True).click()
        # Every test's keys are listed, fifty a page: the customer's are found by the filter.
        page.get_by_label("User (email or id)").fill(CUSTOMER)
        page.get_by_role("button", name="Show").click()
        expect(page.locator(f'tr[data-key-id="{key_id}"]')).to_contain_text(CUSTOMER)
        camera.shoot("admin-keys")
        page.get_by_role("link", name="Plans").click()
        expect(page.locator('[data-plan="pro"]')).to_contain_text("ServiceAi-Pro")
        camera.shoot("admin-plans")

        page.get_by_role("link", name="Audit log").click()
        for action, target in [
            ("user.create", CUSTOMER),
            ("user.set_plan", CUSTOMER),
            ("key.create", key_id),
            ("key.revoke", key_id),
        ]:
            entry = page.locator(f'tr[data-action="{action}"][data-target="{target}"]')
            expect(entry).to_contain_text(OPERATOR)
            expect(entry).to_contain_text("console")
        expect(
            page.locator(f'tr[data-action="user.set_role"][data-target="{OPERATOR}"]')
        ).to_contain_text("cli")
        camera.shoot("admin-audit")
    finally:
        camera.publish()
        context.close()

    check_the_customer(stack, chromium, tmp_path, tokens, key_id)


def check_the_customer(
    stack: Stack,
    chromium: Browser,
    tmp_path: Path,
    tokens: int,
    key_id: str,  # noqa: F811
) -> None:
    """The user the operator made: 403 on every operator route and action (on their own
    account and key, which stay as they were), their requests on their own chart."""
    users = serviceai_cli(stack.database_url, "users", "list", "--json")["data"]
    [customer] = [u for u in users if u["email"] == CUSTOMER]
    context = chromium.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    camera = Camera(page, tmp_path / "customer", first=60)
    camera.folder.mkdir()
    try:
        sign_in(page, stack, CUSTOMER)
        expect(page.get_by_role("link", name="Operator")).to_have_count(0)
        token = page.locator('input[name="csrf_token"]').first.get_attribute("value")
        routes = sorted(
            (method, route.path)
            for route in operator_pages.router.routes
            for method in route.methods - {"HEAD"}
        )
        assert len(routes) >= 15
        for method, path in routes:
            url = stack.origin + "/console" + path.format(user_id=customer["id"], key_id=key_id)
            if method == "GET":
                response = page.goto(url)
                assert response.status == 403, path
                expect(page.get_by_role("alert")).to_have_text(REFUSED)
            else:
                response = page.request.post(
                    url, form={"csrf_token": token, "plan": "pro", "role": "admin"}
                )
                assert response.status == 403 and REFUSED in response.text(), path
        users = serviceai_cli(stack.database_url, "users", "list", "--json")["data"]
        assert [(u["role"], u["plan"], u["disabled"]) for u in users if u["email"] == CUSTOMER] == [
            ("user", "pro", False)
        ]
        page.goto(f"{stack.origin}/console/admin/users")
        camera.shoot("refused-403")

        page.get_by_role("link", name="Back to the console").click()
        page.get_by_role("link", name="Plan and usage").click()
        today = datetime.now(UTC).date().isoformat()
        chart = page.locator('.model-chart[data-model="ServiceAi-Fast"]')
        expect(chart.locator("rect title")).to_have_text(
            f"{today} ServiceAi-Fast: {tokens:,} tokens"
        )
        expect(page.get_by_role("heading", name="Plan: pro")).to_be_visible()
        camera.shoot("own-usage-chart")
    finally:
        camera.publish()
        context.close()
