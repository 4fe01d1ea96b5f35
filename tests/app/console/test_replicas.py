"""The console across ingress replicas: one shared secret, and sessions that end everywhere.

Each `new_browser()` is its own API + console (a replica) on one real key store, SQLite and
PostgreSQL."""

from __future__ import annotations

import pytest

from app.config.service import IngressConfig
from app.console import SESSION_COOKIE, require_shared_secret
from tests.app.console.conftest import PASSWORD, console_settings


def copy_session(source, target) -> None:
    value = source.client.cookies[SESSION_COOKIE]
    target.client.cookies.set(SESSION_COOKIE, value, domain="127.0.0.1", path="/console")


async def test_a_session_holds_on_every_replica_until_it_signs_out_on_one(new_browser):
    first, second, stolen = new_browser(), new_browser(), new_browser()
    await first.sign_up("ada@example.com")
    copy_session(first, second)
    copy_session(first, stolen)
    assert (await second.get("/keys")).status_code == 200
    signed_out = await second.submit("/keys", "/sign-out")
    assert signed_out.headers["location"] == "/console/sign-in"
    # Every copy of the cookie is refused now, on every replica, the one that never signed out
    # included.
    for browser in (first, stolen):
        response = await browser.get("/keys")
        assert (response.status_code, response.headers["location"]) == (303, "/console/sign-in")
    assert (await first.sign_in("ada@example.com")).headers["location"] == "/console/keys"
    assert (await first.get("/keys")).status_code == 200


async def test_a_new_password_ends_every_session(new_browser, store):
    browser = new_browser()
    await browser.sign_up("ada@example.com")
    await store.set_password(
        "ada@example.com", "a brand new password"
    )  # `serviceai users set-password`
    assert (await browser.get("/keys")).status_code == 303
    assert (await browser.sign_in("ada@example.com", PASSWORD)).status_code == 401
    assert (await browser.sign_in("ada@example.com", "a brand new password")).status_code == 303


@pytest.mark.parametrize(
    ("ingress", "replicas"),
    [
        ({"num_replicas": 1}, 1),
        ({"num_replicas": 2}, 2),
        ({"num_replicas": 1, "max_surge_percent": 25}, 2),  # a rollout runs two at once
        ({"autoscaling_config": {"min_replicas": 2, "max_replicas": 16}}, 16),
    ],
)
def test_an_ingress_of_several_replicas_refuses_to_start_without_a_shared_secret(ingress, replicas):
    most = IngressConfig.model_validate(ingress).most_replicas()
    assert most == replicas
    require_shared_secret(console_settings(), most)
    if most == 1:
        require_shared_secret(console_settings(session_secret=None), most)
        return
    with pytest.raises(RuntimeError, match="SERVICEAI_SESSION_SECRET is unset"):
        require_shared_secret(console_settings(session_secret=None), most)
