"""One hostile key against the real stack (HAProxy, Ray Serve, vLLM, Redis): a huge body, a
reply without max_tokens, a client that leaves before the first event, a body that trickles
in, and the production switches for /docs and /admin."""

from __future__ import annotations

import json
import re
import secrets
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from app.console import SESSION_COOKIE
from tests.conftest import Stack, app_args, error_of, type_limits
from tests.e2e.test_limits import REDIS_URL, ingress_app, new_user, usage_of
from tests.e2e.test_stream_lifecycle import wait_until

FAST = "ServiceAi-Fast"
HI = [{"role": "user", "content": "hi"}]
CLAMPED_TOKENS_PER_MINUTE = 100
BODY_READ_TIMEOUT_S = 2
HUGE_BODY = b'{"model": "ServiceAi-Fast", "messages": [' + b",".join([b"{}"] * 699_000) + b"]}"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def hardened(stack: Stack) -> Iterator[tuple[str, str]]:
    """An ingress as production runs it: limits in Redis, docs and /admin off, a short body
    deadline, and a `tight` plan of 100 tokens a minute. (Its base URL, its Redis prefix.)"""
    prefix = f"sai-e2e-{secrets.token_hex(4)}"
    free = app_args()["plans"]["free"]
    tight = {
        t: dict(limits, tokens_per_minute=CLAMPED_TOKENS_PER_MINUTE, concurrent_requests=8)
        for t, limits in type_limits(free).items()
    }
    env = {
        "SERVICEAI_REDIS_URL": REDIS_URL,
        "SERVICEAI_REDIS_KEY_PREFIX": prefix,
        # A slow Redis on this busy machine must show up (503), not serve without limits.
        "SERVICEAI_RATE_LIMIT_FAIL_OPEN": "false",
        "SERVICEAI_REDIS_TIMEOUT_S": "10",
        "SERVICEAI_BODY_READ_TIMEOUT_S": str(BODY_READ_TIMEOUT_S),
        "SERVICEAI_API_DOCS": "false",
        "SERVICEAI_ADMIN_API": "false",
        "SERVICEAI_SIGN_IN_LIMIT_PER_ADDRESS": "2/minute",
    }
    with ingress_app(
        stack, "hardened", env=env, plans=dict(app_args()["plans"], tight=tight)
    ) as url:
        yield url, prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_a_huge_body_is_refused_at_once_and_a_strangers_is_never_parsed(stack):
    _, key = new_user(stack)
    with httpx.Client(base_url=stack.base_url, timeout=60) as http:
        headers = {"content-type": "application/json"}
        started = time.perf_counter()
        response = http.post(
            "/chat/completions", content=HUGE_BODY, headers={**headers, **bearer(key)}
        )
        error = error_of(response, 400)
        assert error["param"] == "messages" and "at most 2048 items" in error["message"]
        stranger = http.post(
            "/chat/completions", content=HUGE_BODY, headers={**headers, **bearer("sai-" + "z" * 43)}
        )
        assert error_of(stranger, 401)["code"] == "invalid_api_key"
        assert time.perf_counter() - started < 30  # a generous bound; the figure is in the README
        # The stack still serves everyone else.
        ok = http.post(
            "/chat/completions",
            json={"model": FAST, "messages": HI, "max_tokens": 1},
            headers=bearer(stack.api_key),
        )
        assert ok.status_code == 200


def test_a_reply_without_max_tokens_stops_at_what_the_plan_has_left(stack, hardened):
    base_url, _ = hardened
    _, key = new_user(stack, plan="tight")
    response = httpx.post(
        f"{base_url}/chat/completions",
        headers=bearer(key),
        timeout=120,
        json={"model": FAST, "messages": HI, "n": 2, "ignore_eos": True},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    # 100 tokens left this minute, shared by 2 choices: 50 each, however long the context.
    assert body["usage"]["completion_tokens"] == CLAMPED_TOKENS_PER_MINUTE
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]


def test_a_client_that_leaves_before_the_first_event_frees_its_slot_and_pays(stack, hardened):
    base_url, prefix = hardened
    user_id, key = new_user(stack)
    engine = stack.handle(FAST)
    slots = f"{prefix}:concurrent/{user_id}/{FAST}"
    store = redis.Redis.from_url(REDIS_URL)
    with httpx.Client(timeout=60) as http:
        for _ in range(3):
            with http.stream(
                "POST",
                f"{base_url}/chat/completions",
                headers=bearer(key),
                json={
                    "model": FAST,
                    "messages": HI,
                    "stream": True,
                    "ignore_eos": True,
                    "max_tokens": 1500,
                },
            ) as response:
                assert response.status_code == 200
                assert "x-ratelimit-limit-requests" in response.headers  # limits were checked
            # Closed on the headers, before reading an event. (Whether the slot is still held
            # at this point is a race: unread, a reply this short can fit in the socket
            # buffers and end at once. tests/app/limits/test_slots.py proves the lease while held.)
    wait_until(lambda: store.zcard(slots) == 0, timeout_s=10)
    wait_until(lambda: engine.running_requests.remote().result() == 0, timeout_s=10)
    usage = usage_of(base_url, key, expected_requests=3)
    assert usage["requests"] == 3 and usage["prompt_tokens"] > 0
    store.close()


@pytest.mark.parametrize(
    "route, body",
    [
        ("chat/completions", {"messages": HI, "max_tokens": 2000}),
        ("responses", {"input": "hi", "max_output_tokens": 2000}),
    ],
)
def test_a_whole_reply_whose_client_leaves_is_charged_what_the_engine_made(
    stack, hardened, route, body
):
    """Without `stream`, the client that gives up mid-generation frees the engine and pays
    its prompt and the tokens made until then (up to the last second's: the replica reports
    a whole reply's counts every second)."""
    base_url, _ = hardened
    _, key = new_user(stack)
    engine = stack.handle(FAST)
    url = urlsplit(f"{base_url}/{route}")
    body = json.dumps({"model": FAST, "ignore_eos": True, **body})
    request = (
        f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    )
    with socket.create_connection((url.hostname, url.port), timeout=10) as client:
        client.sendall(request.encode())
        wait_until(lambda: engine.running_requests.remote().result() == 1, timeout_s=30)
        time.sleep(1.5)  # the engine works on it; the replica has sent its counts at least once
        client.setblocking(False)
        with pytest.raises(BlockingIOError):
            client.recv(1)  # no reply yet: the client leaves mid-generation
    wait_until(lambda: engine.running_requests.remote().result() == 0, timeout_s=10)
    usage = usage_of(base_url, key, expected_requests=1)
    assert usage["requests"] == 1 and usage["prompt_tokens"] > 0, usage
    assert 0 < usage["completion_tokens"] < 2000, usage


def test_a_body_that_trickles_in_gets_408_and_a_strangers_gets_401_at_once(stack, hardened):
    base_url, _ = hardened
    _, key = new_user(stack)
    parts = urlsplit(base_url)

    def send_slowly(token: str) -> tuple[int, dict]:
        body = json.dumps({"model": FAST, "messages": HI}).encode()
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
            sock.sendall(
                f"POST {parts.path}/chat/completions HTTP/1.1\r\nHost: {parts.hostname}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:10]
            )
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        head, _, payload = reply.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(payload)

    started = time.monotonic()
    status, body = send_slowly("sai-" + "q" * 43)
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")
    assert time.monotonic() - started < BODY_READ_TIMEOUT_S
    status, body = send_slowly(key)
    assert (status, body["error"]["code"]) == (408, "request_timeout")
    assert set(body["error"]) == {"message", "type", "param", "code"}


def test_docs_openapi_and_admin_can_be_off_on_the_public_listener(stack, hardened):
    base_url, _ = hardened
    origin = base_url.removesuffix("/v1")
    with httpx.Client(timeout=30) as http:
        for path in ("/docs", "/redoc", "/openapi.json", "/admin/users"):
            response = http.get(f"{origin}{path}", headers=bearer(stack.admin_token))
            assert error_of(response, 404)["code"] == "unknown_url", path
        # The stack's own ingress, with the defaults, still serves them.
        assert http.get(f"{stack.origin}/openapi.json").status_code == 200


def test_a_forged_x_forwarded_for_does_not_buy_more_sign_in_attempts(stack, hardened):
    """Through HAProxy, with no trusted proxy configured, every forged address is one client."""
    base_url, _ = hardened
    console = base_url.removesuffix("/v1") + "/console"
    statuses = []
    with httpx.Client(timeout=30) as browser:
        for forged in ("203.0.113.1", "203.0.113.2", "203.0.113.3"):
            page = browser.get(f"{console}/sign-in")
            token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
            # The session cookie's path is /console, this app's console is under /hardened:
            # send it by hand.
            cookie = f"{SESSION_COOKIE}={page.cookies[SESSION_COOKIE]}"
            response = browser.post(
                f"{console}/sign-in",
                headers={"X-Forwarded-For": forged, "Cookie": cookie},
                data={"csrf_token": token, "email": "nobody@hostile.test", "password": "x" * 12},
            )
            statuses.append(response.status_code)
    assert statuses == [401, 401, 429]
