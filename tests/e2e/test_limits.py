"""Plans and rate limits through the real stack and the official client: 429s and their headers,
the client's retries, usage as the responses reported it, Redis shared by two ingress replicas,
Redis down, and a full model queue."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from ray import serve

from app.builder import build_app
from tests.conftest import APP_NAME, REDIS, Stack, app_args, error_of, free_port, type_limits
from tests.e2e.conftest import prompt_tokens, serviceai_cli
from tests.e2e.processes import wait_until
from tests.e2e.test_observability import scrape, series

HI = [{"role": "user", "content": "hi"}]
REDIS_URL = REDIS
HEADERS = ("requests", "tokens")
QUEUE_DEPTH = "ray_serviceai_queue_depth"
FREE_PRO_RPM = app_args()["plans"]["free"]["ServiceAi-Pro"]["requests_per_minute"]


def new_user(stack: Stack, plan: str = "free") -> tuple[str, str]:
    """(user id, key) of a new user on `plan`, made with the CLI in the stack's store."""
    created = serviceai_cli(
        stack.database_url,
        "users",
        "create",
        "--email",
        f"{secrets.token_hex(5)}@limits.test",
        "--plan",
        plan,
        "--with-key",
        "--json",
    )
    stack.secrets.append(created["key"]["key"])
    return created["user"]["id"], created["key"]["key"]


def limit_headers(headers: httpx.Headers) -> dict[str, str]:
    return {
        f"{part}-{kind}": headers[f"x-ratelimit-{part}-{kind}"]
        for kind in HEADERS
        for part in ("limit", "remaining", "reset")
    }


def usage_of(base_url: str, key: str, expected_requests: int, timeout_s: float = 20) -> dict:
    """The key holder's usage today, summed over model types, once the replicas wrote it."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = httpx.get(
            f"{base_url}/account/usage", headers={"Authorization": f"Bearer {key}"}, timeout=10
        ).json()["data"]
        totals = {
            field: sum(r[field] for r in rows)
            for field in ("requests", "prompt_tokens", "completion_tokens")
        }
        if totals["requests"] >= expected_requests or time.monotonic() > deadline:
            return {**totals, "models": sorted({r["model"] for r in rows})}
        time.sleep(0.5)


@contextmanager
def ingress_app(
    stack: Stack,
    name: str,
    *,
    replicas: int = 1,
    env: dict[str, str] | None = None,
    plans: dict[str, Any] | None = None,
    **args: Any,
) -> Iterator[str]:
    """An extra application over the stack's engines (or its own, with `model_types`); its
    base URL."""
    config = {**app_args(), "models_app": APP_NAME, **args}
    if plans is not None:
        config["plans"] = plans
    config["ingress"] = dict(config["ingress"], num_replicas=replicas, env_vars=env or {})
    serve.run(build_app(config), name=name, route_prefix=f"/{name}")
    try:
        assert serve.status().applications[name].deployments["Ingress"].replica_states == {
            "RUNNING": replicas
        }
        yield f"{stack.origin}/{name}/v1"
    finally:
        serve.delete(name)


def test_done_when_fast_freely_pro_429_after_its_limit_and_exact_usage(stack, tokenizer):
    _, key = new_user(stack)
    client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    reported = {"prompt_tokens": 0, "completion_tokens": 0}
    for _ in range(FREE_PRO_RPM + 5):  # more than Pro allows, all fine on Fast
        raw = client.chat.completions.with_raw_response.create(
            model="ServiceAi-Fast", messages=HI, max_tokens=3
        )
        assert raw.headers["x-ratelimit-limit-requests"] == "1000"
        completion = raw.parse()
        reported["prompt_tokens"] += completion.usage.prompt_tokens
        reported["completion_tokens"] += completion.usage.completion_tokens

    for sent in range(FREE_PRO_RPM):
        raw = client.chat.completions.with_raw_response.create(
            model="ServiceAi-Pro", messages=HI, max_tokens=3
        )
        headers = limit_headers(raw.headers)
        assert headers["limit-requests"] == str(FREE_PRO_RPM)
        assert headers["remaining-requests"] == str(FREE_PRO_RPM - sent - 1)
        assert headers["limit-tokens"] == "20000"
        completion = raw.parse()
        reported["prompt_tokens"] += completion.usage.prompt_tokens
        reported["completion_tokens"] += completion.usage.completion_tokens

    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="ServiceAi-Pro", messages=HI, max_tokens=3)
    error = info.value
    assert error.status_code == 429
    assert (error.body["type"], error.body["code"]) == ("requests", "rate_limit_exceeded")
    message = error.body["message"]
    assert "ServiceAi-Pro" in message and "requests per minute" in message
    headers = error.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert limit_headers(headers)["remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")

    requests = 2 * FREE_PRO_RPM + 5
    usage = usage_of(stack.base_url, key, requests)
    assert usage == {
        "requests": requests,
        **reported,
        "models": ["ServiceAi-Fast", "ServiceAi-Pro"],
    }
    assert reported["prompt_tokens"] == requests * prompt_tokens(tokenizer, HI)


def test_streams_carry_the_headers_before_the_first_byte_and_are_metered(stack, tokenizer):
    _, key = new_user(stack)
    request = {
        "model": "ServiceAi-Coder",
        "messages": HI,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    with httpx.stream(
        "POST",
        f"{stack.base_url}/chat/completions",
        json=request,
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        assert response.status_code == 200
        assert limit_headers(response.headers) == {
            "limit-requests": "10",
            "remaining-requests": "9",
            "reset-requests": "1m0s",
            # The reply's 8 tokens are held for it from admission; the window starts there.
            "limit-tokens": "20000",
            "remaining-tokens": "19992",
            "reset-tokens": "1m0s",
        }
        events = [line for line in response.iter_lines() if line.startswith("data: {")]
    reported = json.loads(events[-1].removeprefix("data: "))["usage"]

    # A stream the client cuts off: what the engine produced until then is counted too.
    long = dict(request, max_tokens=1500, stream_options=None)
    with httpx.stream(
        "POST",
        f"{stack.base_url}/chat/completions",
        json=long,
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        lines = response.iter_lines()
        received = sum(1 for _, line in zip(range(12), lines) if line.startswith("data: {"))

    usage = usage_of(stack.base_url, key, 2)
    assert usage["requests"] == 2
    assert usage["prompt_tokens"] == 2 * reported["prompt_tokens"]
    assert reported["prompt_tokens"] == prompt_tokens(tokenizer, HI)
    # The first stream's 8 tokens, and at least the chunks read of the cut one (one token each).
    assert 8 + received - 1 <= usage["completion_tokens"] < 8 + 1500
    # Charged to the token limit as well.
    follow = httpx.post(
        f"{stack.base_url}/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "ServiceAi-Coder", "messages": HI, "max_tokens": 1},
    )
    used = 20000 - int(follow.headers["x-ratelimit-remaining-tokens"]) - 1  # its own, held
    assert used == usage["prompt_tokens"] + usage["completion_tokens"]


def test_the_client_retries_after_retry_after_and_then_succeeds(stack):
    """Free Pro allows 2 requests at once: a third waits out Retry-After (1 s) and retries."""
    _, key = new_user(stack)
    attempts: list[tuple[float, int]] = []
    hooks = {"response": [lambda r: attempts.append((time.monotonic(), r.status_code))]}
    retrying = openai.OpenAI(
        base_url=stack.base_url,
        api_key=key,
        max_retries=2,
        http_client=httpx.Client(event_hooks=hooks, timeout=60),
    )
    long = {
        "model": "ServiceAi-Pro",
        "messages": HI,
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }
    auth = {"Authorization": f"Bearer {key}"}
    with (
        httpx.stream(
            "POST", f"{stack.base_url}/chat/completions", json=long, headers=auth, timeout=60
        ) as one,
        httpx.stream(
            "POST", f"{stack.base_url}/chat/completions", json=long, headers=auth, timeout=60
        ) as two,
    ):
        assert (one.status_code, two.status_code) == (200, 200)
        # Both slots stay taken until, half a second into the client's wait, one stream ends.
        threading.Timer(0.5, one.close).start()
        completion = retrying.chat.completions.create(
            model="ServiceAi-Pro", messages=HI, max_tokens=2
        )
    assert completion.choices[0].message.content is not None
    assert [status for _, status in attempts] == [429, 200]
    assert attempts[1][0] - attempts[0][0] >= 1.0  # the client slept Retry-After: 1


def test_a_spent_daily_quota_stops_the_clients_retries(stack):
    tiny_quota = {
        "requests_per_minute": 100,
        "tokens_per_minute": 100000,
        "concurrent_requests": 10,
        "tokens_per_day": 40,
    }
    plans = dict(
        app_args()["plans"], tiny={t: tiny_quota for t in type_limits(app_args()["plans"]["free"])}
    )
    _, key = new_user(stack, plan="tiny")
    with ingress_app(stack, "quota", plans=plans) as base_url:
        attempts: list[int] = []
        hooks = {"response": [lambda r: attempts.append(r.status_code)]}
        client = openai.OpenAI(
            base_url=base_url,
            api_key=key,
            max_retries=2,
            http_client=httpx.Client(event_hooks=hooks, timeout=60),
        )
        for _ in range(5):  # ~20 prompt tokens and 4 more each: the quota is spent in 2 or so
            try:
                client.chat.completions.create(
                    model="ServiceAi-Fast",
                    messages=HI,
                    max_tokens=4,
                    extra_body={"ignore_eos": True},
                )
            except openai.RateLimitError as error:
                assert error.body["code"] == "insufficient_quota"
                assert error.body["type"] == "insufficient_quota"
                assert error.response.headers["x-should-retry"] == "false"
                assert "daily token quota" in error.body["message"]
                break
        else:
            pytest.fail("the quota of 40 tokens a day was never spent")
        assert attempts[-1] == 429 and attempts.count(429) == 1  # not retried


def test_a_prompt_beyond_the_context_is_400_whatever_the_counters_say(stack):
    """Decided before admission: a spent quota does not turn it into a 429 that a client
    would wait on (issue 14), and a prompt that fits still gets that 429."""
    tiny_quota = {
        "requests_per_minute": 100,
        "tokens_per_minute": 100000,
        "concurrent_requests": 10,
        "tokens_per_day": 20,
    }
    plans = dict(
        app_args()["plans"], tiny={t: tiny_quota for t in type_limits(app_args()["plans"]["free"])}
    )
    _, key = new_user(stack, plan="tiny")
    long_text = "The quick brown fox jumps over the lazy dog. " * 400  # > 2048 tokens
    with ingress_app(stack, "beyond", plans=plans) as base_url:
        http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        spend = {"model": "ServiceAi-Fast", "messages": HI, "max_tokens": 4, "ignore_eos": True}
        assert http.post("/chat/completions", json=spend).status_code == 200  # ~20 tokens
        spent = error_of(http.post("/chat/completions", json=spend), 429)
        assert spent["code"] == "insufficient_quota"
        for stream in (False, True):
            for model in ("ServiceAi-Fast", "ServiceAi-Coder"):
                beyond = {
                    "model": model,
                    "stream": stream,
                    "messages": [{"role": "user", "content": long_text}],
                }
                error = error_of(http.post("/chat/completions", json=beyond), 400)
                assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
                assert "maximum context length is 2048 tokens" in error["message"]
            beyond = {"model": "ServiceAi-Fast", "stream": stream, "prompt": long_text}
            error = error_of(http.post("/completions", json=beyond), 400)
            assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
        fits = {
            "model": "ServiceAi-Fast",
            "messages": [{"role": "user", "content": long_text[:3000]}],
        }
        assert (
            error_of(http.post("/chat/completions", json=fits), 429)["code"] == "insufficient_quota"
        )


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    prefix = f"sai-e2e-{secrets.token_hex(4)}"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@contextmanager
def plan_app(
    stack: Stack, name: str, plan_name: str, limits: dict[str, int], store: str, redis_prefix: str
) -> Iterator[str]:
    """An ingress app with one more plan (`limits` on every type): its counters in memory on
    one replica, or in Redis shared by two."""
    plans = dict(
        app_args()["plans"],
        **{plan_name: {t: limits for t in type_limits(app_args()["plans"]["free"])}},
    )
    env, replicas = {}, 1
    if store == "redis":
        env = {"SERVICEAI_REDIS_URL": REDIS_URL, "SERVICEAI_REDIS_KEY_PREFIX": redis_prefix}
        replicas = 2
    with ingress_app(stack, name, replicas=replicas, env=env, plans=plans) as base_url:
        yield base_url


def test_two_replicas_share_a_10_a_minute_limit_through_redis(stack, redis_prefix):
    ten = {
        "requests_per_minute": 10,
        "tokens_per_minute": 1000000,
        "concurrent_requests": 100,
        "tokens_per_day": 10000000,
    }
    plans = dict(
        app_args()["plans"], ten={t: ten for t in type_limits(app_args()["plans"]["free"])}
    )
    user_id, key = new_user(stack, plan="ten")
    env = {"SERVICEAI_REDIS_URL": REDIS_URL, "SERVICEAI_REDIS_KEY_PREFIX": redis_prefix}
    with ingress_app(stack, "shared", replicas=2, env=env, plans=plans) as base_url:

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as http:
                responses = await asyncio.gather(
                    *(
                        http.post(
                            f"{base_url}/chat/completions",
                            headers={"Authorization": f"Bearer {key}"},
                            json={"model": "ServiceAi-Fast", "messages": HI, "max_tokens": 1},
                        )
                        for _ in range(30)
                    )
                )
            for response in responses:
                if response.status_code == 429:
                    assert error_of(response, 429)["type"] == "requests"
            return [r.status_code for r in responses]

        statuses = asyncio.run(burst())
        assert (statuses.count(200), statuses.count(429)) == (10, 20)
        assert redis.Redis.from_url(REDIS_URL).exists(
            f"{redis_prefix}:LIMITER/{user_id}/ServiceAi-Fast/requests/10/1/minute"
        )


# (n, max_tokens) of 16 requests sent at once: every one alone fits a fresh 20,000-token minute.
PARALLEL = [(8, None), (1, None), (2, 600), (4, None), (1, 1500), (2, None), (8, 200), (1, 800)] * 2


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_requests_sent_at_once_never_generate_more_than_the_plan(stack, redis_prefix, store):
    """Sixteen requests at once on a plan of 20,000 tokens a minute (mixed `n`, with and
    without max_tokens, streamed and whole, each generating all it may): before reservations
    each saw the whole minute left and together they took several times the plan. In memory
    with one ingress replica, and in Redis with two."""
    plan = {
        "requests_per_minute": 100,
        "tokens_per_minute": 20000,
        "concurrent_requests": 16,
        "tokens_per_day": 1000000,
    }
    _, key = new_user(stack, plan="twenty")
    with plan_app(stack, f"reserve-{store}", "twenty", plan, store, redis_prefix) as base_url:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300)

        async def one(i: int, n: int, max_tokens: int | None) -> tuple[int, int]:
            """(status, completion tokens) of one request."""
            body: dict[str, Any] = dict(
                model="ServiceAi-Fast", messages=HI, n=n, extra_body={"ignore_eos": True}
            )
            if max_tokens is not None:
                body["max_tokens"] = max_tokens
            try:
                if i % 2:
                    stream = await client.chat.completions.create(
                        **body, stream=True, stream_options={"include_usage": True}
                    )
                    usage = [c.usage async for c in stream if c.usage][-1]
                else:
                    usage = (await client.chat.completions.create(**body)).usage
            except openai.RateLimitError as error:
                assert error.body["type"] == "tokens", error.body
                return 429, 0
            return 200, usage.completion_tokens

        async def burst() -> list[tuple[int, int]]:
            return await asyncio.gather(*(one(i, n, m) for i, (n, m) in enumerate(PARALLEL)))

        outcomes = asyncio.run(burst())
    served = [tokens for status, tokens in outcomes if status == 200]
    assert len(served) >= 2 and 429 in [status for status, _ in outcomes]
    assert sum(served) <= 20000, outcomes
    usage = usage_of(stack.base_url, key, len(served))  # written by the app's replicas
    assert usage["completion_tokens"] == sum(served) <= 20000


@pytest.mark.parametrize("fail_open", [None, "true"], ids=["default-closed", "open"])
def test_redis_down_refuses_by_default_or_serves_when_configured(stack, fail_open):
    env = {"SERVICEAI_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    if fail_open is not None:
        env["SERVICEAI_RATE_LIMIT_FAIL_OPEN"] = fail_open
    name = "redis-down-closed" if fail_open is None else "redis-down-open"
    with ingress_app(stack, name, env=env) as base_url:
        response = httpx.post(
            f"{base_url}/chat/completions",
            headers={"Authorization": f"Bearer {stack.api_key}"},
            json={"model": "ServiceAi-Fast", "messages": HI, "max_tokens": 2},
            timeout=60,
        )
    if fail_open is not None:
        assert response.status_code == 200, response.text
        assert not any(h.startswith("x-ratelimit-") for h in response.headers)
        return
    error = error_of(response, 503)
    assert (error["type"], error["code"]) == ("server_error", "rate_limiter_unavailable")
    assert response.headers["retry-after"] == "2"


@contextmanager
def redis_server(port: int, folder: Path) -> Iterator[subprocess.Popen]:
    """A Redis of the test's own on `port`, keeping nothing on disk; stopped at the end."""
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        cwd=folder,
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        wait_until(lambda: _pings(client), timeout_s=20)
        yield server
    finally:
        server.kill()
        server.wait()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_redis_stopped_under_load_leaves_nothing_served_unlimited(stack, tmp_path):
    """Issue 70: in production a Redis outage turned every limit, budget and concurrency cap
    off. Now, with the production profile's default, Redis killed while four clients keep
    sending: every reply served carries the limits' headers, the outage is answered 503 with
    Retry-After, and the service limits again once Redis is back."""
    port = free_port()
    env = {"SERVICEAI_REDIS_URL": f"redis://127.0.0.1:{port}/0", "SERVICEAI_REDIS_TIMEOUT_S": "0.5"}
    seen: list[tuple[int, bool, str | None]] = []
    retry_after: set[str | None] = set()
    stop = threading.Event()

    def client(base_url: str) -> None:
        body = {"model": "ServiceAi-Fast", "messages": HI, "max_tokens": 2}
        auth = {"Authorization": f"Bearer {stack.api_key}"}
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                reply = http.post(f"{base_url}/chat/completions", json=body, headers=auth)
                limited = "x-ratelimit-limit-requests" in reply.headers
                code = reply.json()["error"]["code"] if reply.status_code != 200 else None
                if reply.status_code == 503:
                    retry_after.add(reply.headers.get("retry-after"))
                seen.append((reply.status_code, limited, code))

    with redis_server(port, tmp_path) as server, ingress_app(stack, "redis-stops", env=env) as url:
        clients = [threading.Thread(target=client, args=(url,)) for _ in range(4)]
        for thread in clients:
            thread.start()
        try:
            wait_until(lambda: sum(s == 200 for s, _, _ in seen) >= 8, timeout_s=60)
            server.kill()
            server.wait()
            outage = len(seen)
            wait_until(lambda: sum(s == 503 for s, _, _ in seen[outage:]) >= 8, timeout_s=60)
            with redis_server(port, tmp_path):
                back = len(seen)
                wait_until(lambda: any(s == 200 for s, _, _ in seen[back:]), timeout_s=60)
        finally:
            stop.set()
            for thread in clients:
                thread.join()
    served = [limited for status, limited, _ in seen if status == 200]
    assert served and all(served), "a reply was served without its limits"
    refused = {code for status, _, code in seen if status != 200}
    assert refused <= {"rate_limiter_unavailable", "rate_limit_exceeded"}, refused
    assert "rate_limiter_unavailable" in refused and retry_after == {"2"}


def test_a_full_queue_answers_503_at_once(stack):
    """A model type of its own with one slot and a queue of one: the third request is refused
    while the first two are still generating. The first asks for 4 choices of 2,000 tokens,
    which the engine's one sequence slot runs one after another, so that it outlasts the wait
    for the queue's gauge on a slow machine (1,500 tokens once did not); closing it aborts it."""
    [fast] = [dict(m) for m in app_args()["model_types"] if m["name"] == "ServiceAi-Fast"]
    fast.update(
        max_ongoing_requests=1,
        max_queued_requests=1,
        engine_args=dict(fast["engine_args"], max_num_seqs=1),
    )
    plans = {
        p: {"ServiceAi-Fast": limits["ServiceAi-Fast"]} for p, limits in app_args()["plans"].items()
    }
    with ingress_app(
        stack, "tiny-queue", models_app=None, model_types=[fast], plans=plans
    ) as base_url:
        auth = {"Authorization": f"Bearer {stack.api_key}"}
        long = {
            "model": "ServiceAi-Fast",
            "messages": HI,
            "max_tokens": 2000,
            "n": 4,
            "stream": True,
            "ignore_eos": True,
        }
        short = {"model": "ServiceAi-Fast", "messages": HI, "max_tokens": 8}
        with httpx.stream(
            "POST", f"{base_url}/chat/completions", json=long, headers=auth, timeout=60
        ) as running:
            assert running.status_code == 200
            queued = threading.Thread(
                target=lambda: httpx.post(
                    f"{base_url}/chat/completions", json=short, headers=auth, timeout=120
                )
            )
            queued.start()
            # Wait (not a fixed sleep) until the ingress reports the second request waiting.
            # (Each ingress replica has its own series: the stack's has this type too.)
            depth = series(QUEUE_DEPTH, model_type="ServiceAi-Fast")
            wait_until(
                lambda: scrape(stack, "tiny-queue")[depth] >= 1, timeout_s=30, interval_s=0.5
            )
            refused = httpx.post(
                f"{base_url}/chat/completions", json=short, headers=auth, timeout=60
            )
            # Answered while the first stream still runs: not after a wait for a slot.
            assert not running.is_closed
            next(running.iter_lines())
        queued.join()
    error = error_of(refused, 503)
    assert (error["type"], error["code"]) == ("server_error", "model_overloaded")
    assert refused.headers["retry-after"] == "1"
    assert "ServiceAi-Fast" in error["message"]


CONCURRENT = 32
"""The plan's concurrent requests in the test below (the free plan's on Fast)."""


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_clients_that_keep_the_plans_concurrency_are_never_refused(stack, redis_prefix, store):
    """N clients, each sending its next request the moment its last reply ended (streamed
    and whole, alternately), on a plan of N at once: none refused, as the slot is free before
    the reply's last bytes leave (it was freed after, and 1-2 of 192 were refused). N + 1 at
    once: exactly one 429. In memory with one ingress replica, in Redis with two."""
    plan = {
        "requests_per_minute": 10000,
        "tokens_per_minute": 10**7,
        "concurrent_requests": CONCURRENT,
        "tokens_per_day": 10**9,
    }
    _, key = new_user(stack, plan="at_once")
    with plan_app(stack, f"at-once-{store}", "at_once", plan, store, redis_prefix) as base_url:

        async def back_to_back(client: openai.AsyncOpenAI, i: int) -> int:
            """Requests refused of the 6 one client sends one after another."""
            refused = 0
            for j in range(6):
                body = dict(model="ServiceAi-Fast", messages=HI, max_tokens=8)
                try:
                    if (i + j) % 2:
                        async for _ in await client.chat.completions.create(**body, stream=True):
                            pass
                    else:
                        await client.chat.completions.create(**body)
                except openai.RateLimitError:
                    refused += 1
            return refused

        async def at_once(client: openai.AsyncOpenAI, clients: int) -> list[int]:
            async def one() -> int:
                try:
                    stream = await client.chat.completions.create(
                        model="ServiceAi-Fast",
                        messages=HI,
                        max_tokens=200,
                        stream=True,
                        extra_body={"ignore_eos": True},
                    )
                except openai.RateLimitError as error:
                    assert "concurrent requests" in error.message
                    return 429
                async for _ in stream:
                    pass
                return 200

            return await asyncio.gather(*(one() for _ in range(clients)))

        async def run() -> tuple[list[int], list[int]]:
            async with openai.AsyncOpenAI(
                base_url=base_url, api_key=key, max_retries=0, timeout=300
            ) as client:
                honest = await asyncio.gather(*(back_to_back(client, i) for i in range(CONCURRENT)))
                return honest, await at_once(client, CONCURRENT + 1)

        honest, statuses = asyncio.run(run())
    assert honest == [0] * CONCURRENT
    assert sorted(statuses) == [200] * CONCURRENT + [429]
