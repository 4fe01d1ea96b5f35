"""Usage per key, model type and day in the store, and the meter that writes it in batches."""

import asyncio
from datetime import date, timedelta

import pytest

from app.accounts.keystore import Database, KeyStore
from app.accounts.keystore.database import create_engine
from app.accounts.keystore.errors import KeyStoreError, UserNotFound
from app.accounts.keystore.schemas import UsageTotals
from app.accounts.keystore.usage import DailyTotal, UsageCount, UsageKey, today
from app.limits.usage_meter import UsageMeter

DAY = date(2026, 11, 20)


@pytest.fixture
async def keys(store: KeyStore) -> tuple[str, str, str]:
    """(ada's id, ada's key id, bob's key id)."""
    ada = await store.create_user("ada@example.com")
    bob = await store.create_user("bob@example.com", plan="pro")
    return ada.id, (await store.create_key(ada.id)).id, (await store.create_key(bob.id)).id


async def test_batches_add_up_per_key_model_type_and_day(store, keys):
    ada, ada_key, bob_key = keys
    await store.record_usage(
        {
            UsageKey(ada_key, "ServiceAi-Pro", DAY): UsageCount(2, 30, 40),
            UsageKey(ada_key, "ServiceAi-Fast", DAY): UsageCount(1, 5, 6),
            UsageKey(bob_key, "ServiceAi-Pro", DAY): UsageCount(1, 1, 1),
        }
    )
    await store.record_usage(
        {
            UsageKey(ada_key, "ServiceAi-Pro", DAY): UsageCount(1, 10, 20),
            UsageKey(ada_key, "ServiceAi-Pro", DAY + timedelta(days=1)): UsageCount(1, 7, 8),
        }
    )
    report = await store.usage(user="ada@example.com", start=DAY, end=DAY + timedelta(days=1))
    assert (report.start_date, report.end_date) == (DAY, DAY + timedelta(days=1))
    rows = [
        (r.date, r.model, r.requests, r.prompt_tokens, r.completion_tokens, r.total_tokens)
        for r in report.data
    ]
    assert rows == [
        (DAY, "ServiceAi-Fast", 1, 5, 6, 11),
        (DAY, "ServiceAi-Pro", 3, 40, 60, 100),
        (DAY + timedelta(days=1), "ServiceAi-Pro", 1, 7, 8, 15),
    ]
    assert {(r.user_id, r.key_id) for r in report.data} == {(ada, ada_key)}

    everyone = await store.usage(start=DAY, end=DAY)
    assert len(everyone.data) == 3
    assert [r.key_id for r in (await store.usage(key_id=bob_key, start=DAY, end=DAY)).data] == [
        bob_key
    ]
    before = DAY - timedelta(days=1)
    earlier = await store.usage(user=ada, start=before - timedelta(days=2), end=before)
    assert earlier.data == []


async def test_the_default_range_is_the_last_30_days_and_bad_ranges_are_refused(store, keys):
    report = await store.usage()
    assert report.end_date == today() and report.end_date - report.start_date == timedelta(days=29)
    with pytest.raises(KeyStoreError) as info:
        await store.usage(start=DAY, end=DAY - timedelta(days=1))
    assert info.value.param == "start_date" and info.value.status == 400
    with pytest.raises(UserNotFound):
        await store.usage(user="nobody@example.com")


async def test_usage_today_sums_a_users_keys_per_model_type_its_adapters_within(store, keys):
    ada, ada_key, _ = keys
    second_key = (await store.create_key(ada)).id
    await store.record_usage(
        {
            UsageKey(ada_key, "ServiceAi-Pro", today()): UsageCount(1, 10, 5),
            UsageKey(second_key, "ServiceAi-Pro", today()): UsageCount(1, 10, 5),
            UsageKey(second_key, "ServiceAi-Pro:acme", today()): UsageCount(1, 10, 5),
            UsageKey(ada_key, "ServiceAi-Pro", today() - timedelta(days=1)): UsageCount(9, 9, 9),
        }
    )
    assert await store.usage_today(ada) == {
        "ServiceAi-Pro": UsageTotals(
            requests=3, prompt_tokens=30, completion_tokens=15, total_tokens=45
        )
    }


async def test_the_meter_writes_nothing_until_it_flushes_then_everything_at_once(store, keys):
    _, ada_key, bob_key = keys
    meter = UsageMeter(store, flush_every_s=3600, today=lambda: DAY)
    for _ in range(5):
        meter.record(ada_key, "ServiceAi-Pro", 12, 3)
    meter.record(bob_key, "ServiceAi-Coder", 7, 0)
    assert (await store.usage(start=DAY, end=DAY)).data == []
    await meter.close()  # what a stopping replica does
    rows = {
        (r.key_id, r.model): (r.requests, r.prompt_tokens, r.completion_tokens)
        for r in (await store.usage(start=DAY, end=DAY)).data
    }
    assert rows == {
        (ada_key, "ServiceAi-Pro"): (5, 60, 15),
        (bob_key, "ServiceAi-Coder"): (1, 7, 0),
    }


async def test_the_meter_flushes_on_its_timer(store, keys):
    _, ada_key, _ = keys
    meter = UsageMeter(store, flush_every_s=0.05, today=lambda: DAY)
    meter.start()
    meter.record(ada_key, "ServiceAi-Fast", 1, 2)
    for _ in range(100):
        await asyncio.sleep(0.05)
        if (await store.usage(start=DAY, end=DAY)).data:
            break
    await meter.close()
    [row] = (await store.usage(start=DAY, end=DAY)).data
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 1, 2)


async def test_counts_survive_a_store_outage_until_the_next_round(store, keys):
    _, ada_key, _ = keys
    down = KeyStore(Database(create_engine("postgresql+asyncpg://postgres@127.0.0.1:1/none")))
    meter = UsageMeter(down, today=lambda: DAY)
    meter.record(ada_key, "ServiceAi-Pro", 3, 4)
    await meter.flush()  # refused: kept
    await down.database.close()
    meter.store = store
    meter.record(ada_key, "ServiceAi-Pro", 1, 1)
    await meter.flush()
    [row] = (await store.usage(start=DAY, end=DAY)).data
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (2, 4, 5)


async def test_an_end_date_in_year_one_is_a_range_not_an_overflow(store):
    # Found by the schema fuzzer: end_date=0001-01-01 made the default start overflow (500).
    listing = await store.usage(end=date.min)
    assert (listing.start_date, listing.end_date) == (date.min, date.min)


async def test_everyones_daily_totals_and_the_top_users_and_keys_match_the_rows_per_key(
    store: KeyStore,
):
    """daily_model_usage, kept beside daily_usage as it is written, sums the same numbers."""
    ada = await store.create_user("ada@example.com")
    bob = await store.create_user("bob@example.com")
    ada_keys = [await store.create_key(ada.id, f"a{n}") for n in range(2)]
    bob_key = await store.create_key(bob.id, "b")
    day, before = today(), today() - timedelta(days=1)
    for _ in range(2):  # two flushes add up
        await store.record_usage(
            {
                UsageKey(ada_keys[0].id, "ServiceAi-Fast", day): UsageCount(1, 10, 5),
                UsageKey(ada_keys[1].id, "ServiceAi-Fast", day): UsageCount(2, 20, 10),
                UsageKey(bob_key.id, "ServiceAi-Fast", day): UsageCount(1, 100, 100),
                UsageKey(bob_key.id, "ServiceAi-Pro", before): UsageCount(3, 1, 1),
            }
        )
    assert await store.daily_totals(before, day) == [
        DailyTotal(before, "ServiceAi-Pro", 6, 2, 2),
        DailyTotal(day, "ServiceAi-Fast", 8, 260, 230),
    ]
    assert await store.daily_totals(before, day, user_id=ada.id) == [
        DailyTotal(day, "ServiceAi-Fast", 6, 60, 30),
    ]
    users, keys = await store.top(before, day, limit=2)
    assert [(u.email, u.requests, u.total_tokens) for u in users] == [
        ("bob@example.com", 8, 404),
        ("ada@example.com", 6, 90),
    ]
    assert [(k.key_id, k.email, k.total_tokens) for k in keys] == [
        (bob_key.id, "bob@example.com", 404),
        (ada_keys[1].id, "ada@example.com", 60),
    ]
    [only] = await store.top_keys(before, day, 1, user_id=ada.id)
    assert (only.key_id, only.name, only.requests) == (ada_keys[1].id, "a1", 4)
