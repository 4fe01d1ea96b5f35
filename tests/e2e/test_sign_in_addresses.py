"""The console's per-address sign-in limit through Ray's bundled HAProxy: browsers on two
loopback addresses are two addresses (the wrapper's `option forwardfor`), and a forged
X-Forwarded-For does not move a client to another bucket."""

from __future__ import annotations

import re
import secrets

import httpx

from tests.conftest import Stack

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
PER_ADDRESS = 30  # SERVICEAI_SIGN_IN_LIMIT_PER_ADDRESS's default: 30 a minute


def browser(stack: Stack, address: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=f"{stack.origin}/console", transport=transport, timeout=30)


def sign_in(client: httpx.Client, email: str, password: str, **headers: str) -> int:
    token = CSRF.search(client.get("/sign-in").text).group(1)
    response = client.post(
        "/sign-in",
        headers=headers,
        data={"csrf_token": token, "email": email, "password": password},
    )
    return response.status_code


def test_a_guesser_on_one_address_locks_out_that_address_only(stack: Stack):
    with browser(stack, "127.0.0.2") as guesser, browser(stack, "127.0.0.1") as other:
        statuses = [
            sign_in(
                guesser,
                f"{secrets.token_hex(4)}@guess.test",
                "not the password at all",
                **{"X-Forwarded-For": f"198.51.100.{n % 250}"},
            )  # forged: changes nothing
            for n in range(PER_ADDRESS + 5)
        ]
        assert statuses == [401] * PER_ADDRESS + [429] * 5, statuses
        # Another browser behind the same HAProxy is not locked out.
        assert sign_in(other, f"{secrets.token_hex(4)}@other.test", "a wrong one again") == 401
