"""The plans' counters, one suite run against process memory and the Redis of this machine:
windows that count and charge, concurrency leases renewed while held, never below zero, gone
when their replica stops renewing."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from limits import RateLimitItemPerDay, RateLimitItemPerMinute

from app.accounts.auth import Caller
from app.limits.admission import RateLimits
from app.limits.counters import (
    Ask,
    Budget,
    CounterKeys,
    Counters,
    MemoryCounters,
    RedisCounters,
    reservation,
)
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
    redis = RedisCounters(
        REDIS, key_prefix=f"sai-test-{secrets.token_hex(4)}", ttl_s=TTL_S, clock=clock
    )
    yield redis
    await redis.clear()
    await redis.close()


def keys_of(user: str = "user_x") -> CounterKeys:
    return CounterKeys(
        requests=RateLimitItemPerMinute(10),
        tokens=RateLimitItemPerMinute(1000),
        daily=RateLimitItemPerDay(10_000),
        ids=(user, "ServiceAi-Pro"),
        day=datetime.now(UTC).date().isoformat(),
    )


KEYS = keys_of()
KEY = KEYS.concurrency_key()
ONE = Ask(concurrent_requests=100, reply_tokens=1)
"""A request that fits any window with room: admitted unless the slots or requests are spent."""


async def take(counters: Counters, lease: str) -> int:
    """Admit a request on KEYS holding `lease`; the slots held after."""
    return (await counters.admit(KEYS, lease, ONE)).in_flight


async def test_admission_counts_requests_and_settling_replaces_the_reservation(counters):
    first = await counters.admit(KEYS, "a", Ask(100, reply_tokens=50))
    assert (first.requests, first.tokens, first.daily_tokens, first.in_flight) == (1, 0, 0, 1)
    assert first.reserved == 50
    await counters.settle(KEYS, "a", 50, 120, same_window=True)
    await counters.count_request(KEYS)  # a refused body counts as a request
    second = await counters.admit(KEYS, "b", ONE)
    assert (second.requests, second.tokens, second.daily_tokens, second.in_flight) == (
        3,
        120,
        120,
        1,
    )
    assert await counters.requests_used(KEYS) == 3
    assert second.requests_reset > clock_now() and second.tokens_reset > clock_now()
    other = await counters.admit(keys_of("user_y"), "c", ONE)
    assert (other.requests, other.tokens) == (1, 0)


async def test_requests_admitted_side_by_side_never_hold_more_than_the_window(counters):
    """KEYS: 1,000 tokens a minute. Sixteen requests at once, with and without max_tokens and
    with several choices: what they reserve, and so what they may generate, fits the window;
    the refused ones keep no slot."""
    asks = [
        Ask(100, reply_tokens=tokens, choices=choices, longest=300)
        for tokens, choices in [(200, 1), (None, 1), (None, 3), (400, 4)] * 4
    ]
    seen = await asyncio.gather(*(counters.admit(KEYS, f"r{i}", ask) for i, ask in enumerate(asks)))
    held = [snapshot.reserved for snapshot in seen]
    assert sum(held) <= KEYS.tokens.amount and sum(held) >= KEYS.tokens.amount - 300
    assert await counters.in_flight(KEY) == sum(1 for r in held if r)
    for ask, reserved in zip(asks, held):
        if reserved and ask.reply_tokens is None:  # capped at what was left, each choice at 300
            assert reserved % ask.choices == 0 and reserved // ask.choices <= 300
    # Each reply generates all it reserved, and its prompt of 7 tokens is charged with it:
    # the window passes its limit by at most the prompts of the requests that ran at once.
    for i, reserved in enumerate(held):
        if reserved:
            await counters.settle(KEYS, f"r{i}", reserved, 7 + reserved, same_window=True)
    after = await counters.admit(KEYS, "after", Ask(100, reply_tokens=None))
    admitted = sum(1 for r in held if r)
    assert after.tokens == sum(held) + 7 * admitted <= KEYS.tokens.amount + 7 * admitted
    assert await counters.in_flight(KEY) == 0


async def test_what_a_reply_did_not_use_is_given_back(counters):
    held = await counters.admit(KEYS, "a", Ask(100, reply_tokens=900))
    assert held.reserved == 900
    refused = await counters.admit(KEYS, "b", Ask(100, reply_tokens=200))
    assert refused.reserved == 0 and refused.tokens == 900
    await counters.settle(KEYS, "a", 900, 30, same_window=True)  # stopped early, or failed
    again = await counters.admit(KEYS, "c", Ask(100, reply_tokens=200))
    assert (again.reserved, again.tokens, again.daily_tokens) == (200, 30, 30)


async def test_a_reservation_whose_window_ended_is_not_taken_from_the_next(counters):
    await counters.admit(KEYS, "a", Ask(100, reply_tokens=500))
    await counters.settle(KEYS, "a", 500, 40, same_window=False)
    seen = await counters.admit(KEYS, "b", ONE)
    assert seen.tokens == 540  # the window of the moment gets the 40 used, nothing taken off


@pytest.mark.parametrize("used", [0, 400, 990, 1000, 1200])
@pytest.mark.parametrize(
    ("reply_tokens", "choices", "longest"),
    [
        (None, 1, None),
        (None, 3, None),
        (None, 2, 100),
        (10, 1, None),
        (700, 2, None),
        (1000, 1, 50),
    ],
)
@pytest.mark.parametrize("budgets", [(), (1500,), (1500, 800)], ids=["", "budget", "budgets"])
async def test_both_stores_reserve_exactly_what_reservation_says(
    counters, used, reply_tokens, choices, longest, budgets
):
    """The Lua script and the memory store against the one function both implement."""
    keys = dataclasses.replace(
        KEYS,
        budgets=tuple(
            Budget(f"budget/test/{i}/{secrets.token_hex(4)}", limit, 3600)
            for i, limit in enumerate(budgets)
        ),
    )
    if used:
        await counters.settle(keys, "before", 0, used, same_window=False)
    ask = Ask(2, reply_tokens, choices, longest)
    seen = await counters.admit(keys, "now", ask)
    assert seen.budgets_used == tuple(used for _ in budgets)
    assert seen.reserved == reservation(keys, ask, 1, 1, used, used, seen.budgets_used)
    assert await counters.in_flight(KEY) == (1 if seen.reserved else 0)
    if seen.reserved:  # settling replaces the reservation in the budgets too
        await counters.settle(keys, "now", seen.reserved, 5, same_window=True)
        after = await counters.admit(keys, "after", ONE)
        assert after.budgets_used == tuple(used + 5 for _ in budgets)


async def test_a_budget_is_seeded_once_and_a_counting_window_is_kept(counters):
    budget = Budget(f"budget/key/k/{secrets.token_hex(4)}", 1000, 3600)
    keys = dataclasses.replace(KEYS, budgets=(budget,))
    await counters.seed(budget.key, 300, budget.expiry_s)
    await counters.seed(budget.key, 999, budget.expiry_s)  # already counting: kept
    seen = await counters.admit(keys, "a", Ask(100, reply_tokens=100))
    assert (seen.budgets_used, seen.reserved) == ((300,), 100)


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
    first = await limits.admit(who, "ServiceAi-Pro", 10)
    second = await limits.admit(who, "ServiceAi-Pro", 10)
    key = first._holds[0].keys.concurrency_key()
    assert await limits.counters.in_flight(key) == 2
    assert len(limits.leases._held) == 2
    with pytest.raises(ApiError):  # the free plan runs 2 at once
        await limits.admit(who, "ServiceAi-Pro", 10)
    for _ in range(3):  # settling again (a response and an error path both) changes nothing
        first.settle(1, 1)
    await limits.close()
    assert await limits.counters.in_flight(key) == 1
    second.settle(1, 1)
    await limits.close()
    assert await limits.counters.in_flight(key) == 0
    assert not limits.leases._held
