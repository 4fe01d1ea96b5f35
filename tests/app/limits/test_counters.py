"""The plans' counters, one suite run against process memory and the Redis of this machine:
windows that count and charge, concurrency leases renewed while held, never below zero, gone
when their replica stops renewing."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from limits import RateLimitItemPerDay, RateLimitItemPerMinute

from app.accounts.auth import Caller
from app.limits.admission import RateLimits
from app.limits.counters import CounterKeys, Counters, MemoryCounters, RedisCounters
from app.limits.plans import Plans
from app.limits.slots import LeaseKeeper
from app.openai.errors import ApiError
from tests.conftest import REDIS, app_args

TTL_S = 15.0


class Clock:
    """A clock the test moves, so that expiry is tested without sleeping."""

    def __init__(self) -> None:
        import time

        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["memory", "redis"])
async def counters(request, clock: Clock) -> AsyncIterator[Counters]:
    if request.param == "memory":
        yield MemoryCounters(TTL_S, clock)
        return
    redis = RedisCounters(REDIS, key_prefix=f"sai-test-{secrets.token_hex(4)}", ttl_s=TTL_S,
                          clock=clock)
    yield redis
    await redis.clear()
    await redis.close()


def keys_of(user: str = "user_x") -> CounterKeys:
    return CounterKeys(
        requests=RateLimitItemPerMinute(10), tokens=RateLimitItemPerMinute(1000),
        daily=RateLimitItemPerDay(10_000), ids=(user, "ServiceAi-Pro"),
        day=datetime.now(UTC).date().isoformat(),
    )


KEYS = keys_of()
KEY = KEYS.concurrency_key()


async def take(counters: Counters, lease: str) -> int:
    """Admit a request on KEYS holding `lease`; the slots held after."""
    return (await counters.admit(KEYS, lease)).in_flight


async def test_admission_counts_requests_and_charges_add_tokens_to_both_windows(counters):
    first = await counters.admit(KEYS, "a")
    assert (first.requests, first.tokens, first.daily_tokens, first.in_flight) == (1, 0, 0, 1)
    await counters.charge(KEYS, "a", 120)
    await counters.count_request(KEYS)  # a refused body counts as a request
    second = await counters.admit(KEYS, "b")
    assert (second.requests, second.tokens, second.daily_tokens, second.in_flight) == (
        3, 120, 120, 1)
    assert await counters.requests_used(KEYS) == 3
    assert second.requests_reset > clock_now() and second.tokens_reset > clock_now()
    other = await counters.admit(keys_of("user_y"), "c")
    assert (other.requests, other.tokens) == (1, 0)


def clock_now() -> float:
    import time

    return time.time()


async def test_each_take_counts_the_live_leases(counters):
    assert await take(counters, "a") == 1
    assert await take(counters, "b") == 2
    assert await counters.in_flight(KEY) == 2


async def test_a_release_twice_or_out_of_order_never_goes_below_zero(counters):
    await take(counters, "a")
    await counters.release(KEY, "a")
    await counters.release(KEY, "a")
    await counters.release(KEY, "never-taken")
    assert await counters.in_flight(KEY) == 0
    assert await take(counters, "b") == 1


async def test_a_lease_nobody_renews_lapses_within_the_ttl(counters, clock):
    """A replica that died holds its slots for TTL_S at most, not for an hour."""
    await take(counters, "dead-replica")
    clock.now += TTL_S + 0.1
    assert await counters.in_flight(KEY) == 0
    assert await take(counters, "new") == 1


async def test_a_renewed_lease_outlives_its_first_ttl_and_a_released_one_stays_gone(
    counters, clock
):
    """A long stream keeps its slot past the TTL (the old counter expired under it)."""
    await take(counters, "long")
    await take(counters, "short")
    await counters.release(KEY, "short")
    for _ in range(5):
        clock.now += TTL_S * 0.6
        await counters.renew([(KEY, "long"), (KEY, "short")])
    assert await counters.in_flight(KEY) == 1
    await counters.release(KEY, "long")
    assert await counters.in_flight(KEY) == 0


async def test_the_keeper_renews_what_it_holds_and_forgets_what_it_dropped(counters, clock):
    keeper = LeaseKeeper(counters, every_s=3600)  # renewed by hand below, not by its timer
    await take(counters, "held")
    await take(counters, "dropped")
    keeper.hold(KEY, "held")
    keeper.hold(KEY, "dropped")
    keeper.drop("dropped")
    clock.now += TTL_S * 0.9
    await keeper.renew()
    clock.now += TTL_S * 0.9
    assert await counters.in_flight(KEY) == 1
    await keeper.close()


@pytest.fixture(params=["memory", "redis"])
async def limits(request) -> AsyncIterator[RateLimits]:
    plans = Plans.model_validate(app_args()["plans"])
    if request.param == "memory":
        yield RateLimits(plans, MemoryCounters())
        return
    redis = RedisCounters(REDIS, key_prefix=f"sai-test-{secrets.token_hex(4)}")
    limits = RateLimits(plans, redis)
    yield limits
    await limits.close()
    await redis.clear()
    await redis.close()


async def test_an_admission_holds_a_lease_until_it_settles_once(limits):
    who = Caller(key_id="key_x", user_id=f"user_{secrets.token_hex(6)}", plan="free")
    first = await limits.admit(who, "ServiceAi-Pro", None)
    second = await limits.admit(who, "ServiceAi-Pro", None)
    key = first._keys.concurrency_key()
    assert await limits.counters.in_flight(key) == 2
    assert len(limits.leases._held) == 2
    with pytest.raises(ApiError):  # the free plan runs 2 at once
        await limits.admit(who, "ServiceAi-Pro", None)
    for _ in range(3):  # settling again (a response and an error path both) changes nothing
        first.settle(1, 1)
    await limits.close()
    assert await limits.counters.in_flight(key) == 1
    second.settle(1, 1)
    await limits.close()
    assert await limits.counters.in_flight(key) == 0
    assert not limits.leases._held
