"""Rate limits of the shipped plans, counted in memory and in the Redis of this machine."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets

import pytest

from app.accounts.auth import Caller
from app.accounts.keystore.schemas import KeyLimits
from app.limits import admission as admission_module
from app.limits.admission import UNLIMITED, RateLimits
from app.limits.counters import MemoryCounters, open_counters
from app.limits.plans import Plans
from app.limits.refusals import duration
from app.openai.errors import ApiError
from app.openai.protocol import ReplyLength
from tests.app.shipped_plans import FAST, PLANS, PRO, caller
from tests.conftest import REDIS, free_port


def refused(exc: pytest.ExceptionInfo[ApiError], type: str, code: str) -> ApiError:
    error = exc.value
    assert (error.status, error.type, error.code) == (429, type, code)
    assert "Traceback" not in error.message
    return error


async def test_every_admission_carries_the_six_openai_headers(limits):
    admission = await limits.admit(caller(), PRO, 100)
    assert admission.headers == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "1m0s",
        "x-ratelimit-limit-tokens": "20000",
        "x-ratelimit-remaining-tokens": "19900",  # the reply's 100 are held for it
        "x-ratelimit-reset-tokens": "1m0s",  # the window starts with that reservation
    }


async def test_the_eleventh_request_in_a_minute_is_refused_with_retry_after(limits):
    who = caller()
    for remaining in range(9, -1, -1):
        admission = await limits.admit(who, PRO, None)
        assert admission.headers["x-ratelimit-remaining-requests"] == str(remaining)
        admission.settle(1, 1)
        await limits.close()  # the charge and release run in the background: wait for them
    with pytest.raises(ApiError) as exc:
        await limits.admit(who, PRO, None)
    error = refused(exc, "requests", "rate_limit_exceeded")
    assert "ServiceAi-Pro" in error.message and "requests per minute" in error.message
    assert "limit 10" in error.message
    assert 1 <= int(error.headers["Retry-After"]) <= 60
    assert f"Retry in {error.headers['Retry-After']} s." in error.message
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    # The fast type of the same plan is counted apart.
    assert (await limits.admit(who, FAST, None)).headers["x-ratelimit-limit-requests"] == "1000"


async def test_tokens_are_charged_after_the_reply_and_refuse_once_spent(limits):
    who = caller()
    (await limits.admit(who, PRO, None)).settle(15_000, 4_000)
    await limits.close()
    with pytest.raises(ApiError) as exc:  # max_tokens alone exceeds what is left
        await limits.admit(who, PRO, 1001)
    error = refused(exc, "tokens", "rate_limit_exceeded")
    assert "1001" in error.message and "1000 of 20000" in error.message

    admission = await limits.admit(who, PRO, None)
    assert (admission.reserved, admission.reply_length(4096)) == (1000, 1000)
    assert admission.headers["x-ratelimit-remaining-tokens"] == "0"  # held for this reply
    assert admission.headers["x-ratelimit-reset-tokens"] != "0s"
    with pytest.raises(ApiError) as exc:  # nothing is left beside it while it runs
        await limits.admit(who, PRO, 1)
    refused(exc, "tokens", "rate_limit_exceeded")

    admission.settle(900, 200)  # past the limit: still counted in full
    await limits.close()
    with pytest.raises(ApiError) as exc:
        await limits.admit(who, PRO, None)
    error = refused(exc, "tokens", "rate_limit_exceeded")
    assert "used or held by running requests 20100" in error.message
    assert error.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_a_spent_daily_quota_says_do_not_retry(limits):
    limits.plans = Plans.model_validate(
        {
            "free": {
                "ServiceAi-Coder": {
                    "requests_per_minute": 100,
                    "tokens_per_minute": 10**6,
                    "concurrent_requests": 2,
                    "tokens_per_day": 200_000,
                }
            }
        }
    )
    who = caller()
    for _ in range(10):  # 10 x 19,900 = 199,000 of the 200,000 tokens of a day
        admission = await limits.admit(who, "ServiceAi-Coder", None)
        admission.settle(19_000, 900)
        await limits.close()
    with pytest.raises(ApiError) as exc:
        await limits.admit(who, "ServiceAi-Coder", 1500)
    error = refused(exc, "insufficient_quota", "insufficient_quota")
    assert error.headers["x-should-retry"] == "false"
    assert "1000 of 200000 tokens left today" in error.message and "00:00 UTC" in error.message
    (await limits.admit(who, "ServiceAi-Coder", 1000)).settle(1000, 0)
    await limits.close()
    with pytest.raises(ApiError) as exc:
        await limits.admit(who, "ServiceAi-Coder", None)
    assert "0 of 200000" in refused(exc, "insufficient_quota", "insufficient_quota").message


async def test_concurrent_requests_beyond_the_plan_wait_for_a_slot(limits):
    who = caller()
    first = await limits.admit(who, PRO, 10)
    await limits.admit(who, PRO, 10)
    with pytest.raises(ApiError) as exc:
        await limits.admit(who, PRO, 10)
    error = refused(exc, "requests", "rate_limit_exceeded")
    assert "concurrent requests" in error.message and error.headers["Retry-After"] == "1"
    first.settle(10, 10)
    await limits.close()
    await limits.admit(who, PRO, 10)


async def test_an_unknown_plan_is_refused_naming_the_plans(limits):
    with pytest.raises(ApiError) as exc:
        await limits.admit(caller("gold"), PRO, None)
    assert (exc.value.status, exc.value.code) == (403, "unknown_plan")
    assert "'gold'" in exc.value.message and "free, pro" in exc.value.message


async def test_two_replicas_on_one_redis_share_the_limit_exactly():
    ten_a_minute = Plans.model_validate(
        {
            "free": {
                PRO: {
                    "requests_per_minute": 10,
                    "tokens_per_minute": 10**6,
                    "concurrent_requests": 100,
                    "tokens_per_day": 10**9,
                }
            }
        }
    )
    prefix = f"sai-test-{secrets.token_hex(4)}"
    # Failing closed, so that a slow Redis on a busy machine shows up instead of counting as
    # served.
    replicas = [
        RateLimits(ten_a_minute, open_counters(REDIS, key_prefix=prefix), fail_open=False)
        for _ in range(2)
    ]
    who = caller()

    async def one(i: int) -> str:
        try:
            (await replicas[i % 2].admit(who, PRO, 1)).settle(1, 1)
            return "served"
        except ApiError as error:
            return error.type

    try:
        outcomes = await asyncio.gather(*(one(i) for i in range(30)))
        assert (outcomes.count("served"), outcomes.count("requests")) == (10, 20)
    finally:
        for replica in replicas:
            await replica.close()
        await replicas[0].counters.clear()


class _CountingWrites(MemoryCounters):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    async def count_request(self, keys, requests: int = 1) -> None:
        self.writes += 1
        await asyncio.sleep(0)  # a round trip, during which more bodies are refused
        await super().count_request(keys, requests)


async def test_a_burst_of_refused_bodies_is_counted_whole_in_a_few_writes():
    storage = _CountingWrites()
    limits, who = RateLimits(PLANS, storage), caller()
    for _ in range(500):
        limits.count_refused(who, FAST)
    await asyncio.sleep(0)  # the first write is under way
    for _ in range(500):
        limits.count_refused(who, FAST)
    await limits.written()
    keys = limits._keys(who, FAST, PLANS.get(who.plan).on(FAST))
    assert await storage.requests_used(keys) == 1000
    assert storage.writes == 2  # not a thousand writes queueing for the storage's connections


async def test_a_refusal_goes_out_after_its_count_is_written():
    # Written off the response path, the count could land after the caller's next request
    # on a loaded ingress: the 11th request of a minute was once admitted in CI.
    storage = _CountingWrites()
    limits, who = RateLimits(PLANS, storage), caller()
    keys = limits._keys(who, FAST, PLANS.get(who.plan).on(FAST))
    await asyncio.gather(*(limits.refuse(who, FAST) for _ in range(3)))
    assert await storage.requests_used(keys) == 3  # no written() needed
    assert storage.writes == 1


async def test_a_refusal_waits_for_its_count_only_so_long(monkeypatch):
    class _Stuck(MemoryCounters):
        async def count_request(self, keys, requests: int = 1) -> None:
            await asyncio.Event().wait()  # a storage that never answers

    monkeypatch.setattr(admission_module, "REFUSED_WRITE_WAIT_S", 0.05)
    limits = RateLimits(PLANS, _Stuck())
    async with asyncio.timeout(5):
        await limits.refuse(caller(), FAST)
    for task in list(limits.writes.running):
        task.cancel()


@pytest.mark.parametrize("fail_open", [True, False])
async def test_unreachable_redis_fails_open_or_closed_as_configured(fail_open, caplog):
    storage = open_counters(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    limits = RateLimits(PLANS, storage, fail_open=fail_open)
    if fail_open:
        assert await limits.admit(caller(), PRO, None) is UNLIMITED
        assert await limits.admit(caller(), PRO, None) is UNLIMITED
        warnings = [r for r in caplog.records if "Rate-limit storage unreachable" in r.message]
        assert len(warnings) == 1 and "serving without limits" in warnings[0].message
        return
    with pytest.raises(ApiError) as exc:
        await limits.admit(caller(), PRO, None)
    error = exc.value
    assert (error.status, error.type) == (503, "server_error")
    assert error.code == "rate_limiter_unavailable"
    assert error.headers["Retry-After"] == "2"


def test_the_default_is_to_fail_closed():
    """A Redis outage turned every limit, budget and concurrency cap off by default: now it
    is a 503 unless the operator asks for the opposite."""
    from app.config.settings import Settings

    assert Settings().rate_limit_fail_open is False


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (0.2, "1s"), (59.1, "1m0s"), (360, "6m0s"), (3723, "1h2m3s")]
)
def test_reset_times_read_like_openai_s(seconds, text):
    assert duration(seconds) == text


def scoped(**fields) -> Caller:
    """A caller on the free plan whose key (or user) has the scopes given."""
    return dataclasses.replace(caller(), **fields)


async def test_a_keys_own_limits_apply_with_the_plan_and_the_tighter_wins(limits):
    who = scoped(key_limits=KeyLimits(requests_per_minute=3, tokens_per_minute=300))
    first = await limits.admit(who, FAST, 100)
    # Fast's plan allows 1M tokens a minute; the key 300, so its headers are the key's.
    assert first.headers["x-ratelimit-limit-tokens"] == "300"
    assert first.headers["x-ratelimit-remaining-tokens"] == "200"
    with pytest.raises(ApiError) as exc:  # 100 held, 250 more do not fit the key's 300
        await limits.admit(who, FAST, 250)
    error = refused(exc, "tokens", "rate_limit_exceeded")
    assert "this API key's tokens per minute" in error.message
    first.settle(5, 20)
    await limits.close()
    # Across model types: the key's 3 a minute (the refused request above counted too).
    second = await limits.admit(who, PRO, 100)
    second.settle(5, 5)
    await limits.close()
    with pytest.raises(ApiError) as exc:
        await limits.admit(who, FAST, 1)
    assert (
        "this API key's requests per minute: limit 3"
        in refused(exc, "requests", "rate_limit_exceeded").message
    )
    # The plan's windows gave back what the key refused: another key of the user is not held.
    other = dataclasses.replace(who, key_id="key_other", key_limits=None)
    assert (await limits.admit(other, PRO, 19_000)).reserved == 19_000


async def test_a_keys_concurrency_and_a_plan_tighter_than_the_key(limits):
    who = scoped(key_limits=KeyLimits(concurrent_requests=1, tokens_per_minute=10**6))
    await limits.admit(who, FAST, 10)
    with pytest.raises(ApiError) as exc:
        await limits.admit(who, FAST, 10)
    assert (
        "this API key's concurrent requests"
        in refused(exc, "requests", "rate_limit_exceeded").message
    )
    loose = scoped(key_limits=KeyLimits(tokens_per_minute=10**6))
    with pytest.raises(ApiError) as exc:  # Pro's free plan: 20,000 a minute, whatever the key
        await limits.admit(loose, PRO, 20_001)
    assert "your plan's" in exc.value.message or "plan" in exc.value.message


@pytest.mark.parametrize("whose", ["key", "user"])
async def test_a_spent_monthly_budget_says_do_not_retry(limits, whose):
    field = "key_monthly_tokens" if whose == "key" else "user_monthly_tokens"
    who = scoped(**{field: 1000})
    (await limits.admit(who, FAST, 600)).settle(50, 600)
    await limits.close()
    with pytest.raises(ApiError) as exc:  # 650 used: 400 does not fit the 350 left
        await limits.admit(who, PRO, 400)
    error = refused(exc, "insufficient_quota", "insufficient_quota")
    assert error.headers["x-should-retry"] == "false"
    owner = "this API key's" if whose == "key" else "your account's"
    assert f"{owner[0].upper()}{owner[1:]} monthly token budget" in error.message
    assert "350 of 1000 tokens left this month" in error.message
    # Without max_tokens the reply is capped at what the budget has left.
    assert (await limits.admit(who, PRO, None)).reply_cap == 350
    with pytest.raises(ApiError) as exc:  # a reply that can never fit: as a spent budget
        limits.check_fits(who, FAST, ReplyLength("max_tokens", 1001))
    error = refused(exc, "insufficient_quota", "insufficient_quota")
    assert error.headers == {"x-should-retry": "false"}
    assert f"{owner[0].upper()}{owner[1:]} monthly token budget (1000 tokens)" in error.message


async def test_a_budget_starts_from_what_the_key_store_says_was_used(limits):
    asked: list[tuple[str, str]] = []

    async def monthly_usage(kind: str, owner: str) -> int:
        asked.append((kind, owner))
        return 900

    limits._monthly_usage = monthly_usage
    who = scoped(key_monthly_tokens=1000)
    with pytest.raises(ApiError) as exc:
        await limits.admit(who, FAST, 200)
    assert "100 of 1000" in exc.value.message
    (await limits.admit(who, FAST, 100)).settle(0, 0)
    await limits.close()
    assert asked == [("key", who.key_id)]  # read once per month and replica
