"""Concurrency slots as leases, one set of tests run against process memory and the Redis of
this machine: renewed while held, never below zero, gone when their replica stops renewing."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest

from app.auth import Caller
from app.errors import ApiError
from app.plans import Plans
from app.ratelimit import RateLimits, open_storage
from app.slots import LeaseKeeper, MemorySlots, RedisSlots, Slots
from tests.conftest import app_args

REDIS_URL = "redis://127.0.0.1:6379/0"
TTL_S = 15.0
KEY = "concurrent/user_x/ServiceAi-Pro"


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
async def slots(request, clock: Clock) -> AsyncIterator[Slots]:
    if request.param == "memory":
        yield MemorySlots(TTL_S, clock)
        return
    storage = open_storage(REDIS_URL, key_prefix=f"sai-test-{secrets.token_hex(4)}")
    yield RedisSlots(storage, TTL_S, clock)
    await storage.reset()


async def test_each_take_counts_the_live_leases(slots):
    assert await slots.take(KEY, "a") == 1
    assert await slots.take(KEY, "b") == 2
    assert await slots.count(KEY) == 2


async def test_a_release_twice_or_out_of_order_never_goes_below_zero(slots):
    await slots.take(KEY, "a")
    await slots.release(KEY, "a")
    await slots.release(KEY, "a")
    await slots.release(KEY, "never-taken")
    assert await slots.count(KEY) == 0
    assert await slots.take(KEY, "b") == 1


async def test_a_lease_nobody_renews_lapses_within_the_ttl(slots, clock):
    """A replica that died holds its slots for TTL_S at most, not for an hour."""
    await slots.take(KEY, "dead-replica")
    clock.now += TTL_S + 0.1
    assert await slots.count(KEY) == 0
    assert await slots.take(KEY, "new") == 1


async def test_a_renewed_lease_outlives_its_first_ttl_and_a_released_one_stays_gone(
    slots, clock
):
    """A long stream keeps its slot past the TTL (the old counter expired under it)."""
    await slots.take(KEY, "long")
    await slots.take(KEY, "short")
    await slots.release(KEY, "short")
    for _ in range(5):
        clock.now += TTL_S * 0.6
        await slots.renew([(KEY, "long"), (KEY, "short")])
    assert await slots.count(KEY) == 1
    await slots.release(KEY, "long")
    assert await slots.count(KEY) == 0


async def test_the_keeper_renews_what_it_holds_and_forgets_what_it_dropped(slots, clock):
    keeper = LeaseKeeper(slots, every_s=3600)  # renewed by hand below, not by its timer
    await slots.take(KEY, "held")
    await slots.take(KEY, "dropped")
    keeper.hold(KEY, "held")
    keeper.hold(KEY, "dropped")
    keeper.drop("dropped")
    clock.now += TTL_S * 0.9
    await keeper.renew()
    clock.now += TTL_S * 0.9
    assert await slots.count(KEY) == 1
    await keeper.close()


@pytest.fixture(params=["memory", "redis"])
async def limits(request) -> AsyncIterator[RateLimits]:
    plans = Plans.model_validate(app_args()["plans"])
    if request.param == "memory":
        yield RateLimits(plans, open_storage(None))
        return
    storage = open_storage(REDIS_URL, key_prefix=f"sai-test-{secrets.token_hex(4)}")
    limits = RateLimits(plans, storage)
    yield limits
    await limits.close()
    await storage.reset()


async def test_an_admission_holds_a_lease_until_it_settles_once(limits):
    who = Caller(key_id="key_x", user_id=f"user_{secrets.token_hex(6)}", plan="free")
    first = await limits.admit(who, "ServiceAi-Pro", None)
    second = await limits.admit(who, "ServiceAi-Pro", None)
    key = first._counters.concurrency_key()
    assert await limits.slots.count(key) == 2
    assert len(limits.leases._held) == 2
    with pytest.raises(ApiError):  # the free plan runs 2 at once
        await limits.admit(who, "ServiceAi-Pro", None)
    for _ in range(3):  # settling again (a response and an error path both) changes nothing
        first.settle(1, 1)
    await limits.close()
    assert await limits.slots.count(key) == 1
    second.settle(1, 1)
    await limits.close()
    assert await limits.slots.count(key) == 0
    assert not limits.leases._held
