"""No key, key hash, admin token or Authorization header in any log of the session's Ray cluster.

Runs last (see conftest): by then the session has created, used, revoked and mistyped keys on
every path, and every ingress and replica has written its logs.
"""

from __future__ import annotations

import re
import time

import httpx

from app.keystore import keygen
from tests.conftest import Stack

AUTHORIZATION_HEADER = re.compile(r"(?i)authorization['\"]?\s*[:=,]\s*['\"]?\s*(bearer|basic)")
BEARER_VALUE = re.compile(r"(?i)bearer\s+[A-Za-z0-9_\-.]{8,}")
ANY_KEY = re.compile(r"sai-[A-Za-z0-9_-]{43}")


def provoke_failures(stack: Stack) -> None:
    """Requests that end in every failure path that might be tempted to log what it got."""
    unknown = keygen.issue().secret
    stack.secrets.append(unknown)
    for headers in ({"Authorization": f"Bearer {unknown}"}, {"Authorization": f"Bearer {unknown}x"},
                    {"Authorization": f"Basic {unknown}"}):
        httpx.get(f"{stack.base_url}/models", headers=headers)
        httpx.get(f"{stack.origin}/admin/users", headers=headers)
    key = {"Authorization": f"Bearer {stack.api_key}"}
    httpx.post(f"{stack.base_url}/chat/completions", headers=key, json={"model": "gpt-4", "messages": []})
    httpx.post(f"{stack.base_url}/account/keys", headers=key, json={"name": "x" * 500})


def test_no_secret_reaches_a_log(stack: Stack):
    provoke_failures(stack)
    time.sleep(2)  # let the replicas' log handlers flush
    files = stack.log_files()
    assert any("serve" in str(p) for p in files), files
    needles = {s for s in stack.secrets} | {keygen.hash_key(s) for s in stack.secrets}
    assert len(stack.secrets) >= 8, "the session should have used several keys by now"
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
