"""No key, key hash, admin token or Authorization header in any log of the session's Ray cluster.

Runs last (see conftest), so it reads the logs of everything the session did, and first walks
every key path itself so that it proves something when run alone too.
"""

from __future__ import annotations

import re
import secrets

import httpx

from app.accounts.keystore import keygen
from tests.conftest import Stack
from tests.e2e.processes import wait_until

AUTHORIZATION_HEADER = re.compile(r"(?i)authorization['\"]?\s*[:=,]\s*['\"]?\s*(bearer|basic)")
BEARER_VALUE = re.compile(r"(?i)bearer\s+[A-Za-z0-9_\-.]{8,}")
ANY_KEY = re.compile(r"sai-[A-Za-z0-9_-]{43}")


def exercise_every_key_path(stack: Stack) -> None:
    """Use keys on every path that might be tempted to log what it got: success, streaming,
    creation, revocation, each kind of refusal, the admin API with wrong credentials."""
    admin = {"Authorization": f"Bearer {stack.admin_token}"}
    user = httpx.post(
        f"{stack.origin}/admin/users", headers=admin, json={"email": "logs@example.com"}
    )
    key = httpx.post(f"{stack.origin}/admin/users/{user.json()['id']}/keys", headers=admin).json()[
        "key"
    ]
    own = {"Authorization": f"Bearer {key}"}
    chat = {
        "model": "ServiceAi-Fast",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    assert (
        httpx.post(
            f"{stack.base_url}/chat/completions", headers=own, json=chat, timeout=60
        ).status_code
        == 200
    )
    httpx.post(
        f"{stack.base_url}/chat/completions", headers=own, json={**chat, "stream": True}, timeout=60
    )
    second = httpx.post(f"{stack.base_url}/account/keys", headers=own, json={"name": "logs"}).json()
    httpx.delete(f"{stack.base_url}/account/keys/{second['id']}", headers=own)
    unknown = keygen.issue().secret
    stack.secrets += [key, second["key"], unknown]
    for headers in (
        {"Authorization": f"Bearer {second['key']}"},
        {"Authorization": f"Bearer {unknown}"},
        {"Authorization": f"Bearer {unknown}x"},
        {"Authorization": f"Basic {unknown}"},
        own,
    ):
        httpx.get(f"{stack.base_url}/models", headers=headers)
        httpx.get(f"{stack.origin}/admin/users", headers=headers)
    httpx.post(
        f"{stack.base_url}/chat/completions", headers=own, json={"model": "gpt-4", "messages": []}
    )
    httpx.post(f"{stack.base_url}/account/keys", headers=own, json={"name": "x" * 500})


def test_no_secret_reaches_a_log(stack: Stack):
    exercise_every_key_path(stack)
    # The ingress logs each request once its response is sent: the last one on disk is the
    # sign that every earlier one is.
    last = f"secrets-in-logs-{secrets.token_hex(4)}"
    httpx.get(
        f"{stack.base_url}/models",
        headers={"Authorization": f"Bearer {stack.api_key}", "x-request-id": last},
    )
    wait_until(
        lambda: any(last in p.read_text(errors="replace") for p in stack.log_files()), timeout_s=30
    )
    files = stack.log_files()
    assert any("serve" in str(p) for p in files), files
    needles = set(stack.secrets) | {keygen.hash_key(s) for s in stack.secrets}
    saw_requests = False
    for path in files:
        text = path.read_text(errors="replace")
        saw_requests = saw_requests or "/v1/models" in text
        leaked = [n[:8] + "..." for n in needles if n in text]
        assert not leaked, f"{path} contains secrets {leaked}"
        for pattern in (AUTHORIZATION_HEADER, BEARER_VALUE, ANY_KEY):
            match = pattern.search(text)
            assert match is None, f"{path}: {pattern.pattern} matches {match.group(0)[:20]!r}..."
    assert saw_requests, "the logs should show the session's requests (wrong folder?)"
