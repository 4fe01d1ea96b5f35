"""Usage that survives a crash: a replica's journal replayed by the next one, on a real store
(SQLite and PostgreSQL)."""

from __future__ import annotations

import os

from app.accounts.keystore import Database, KeyStore
from app.accounts.keystore.errors import StoreUnavailable
from app.accounts.keystore.usage import today
from app.limits.usage_journal import UsageJournal, default_folder
from app.limits.usage_meter import UsageMeter


async def used(store: KeyStore, user: str) -> tuple[int, int, int]:
    rows = (await store.usage(user=user)).data
    return (
        sum(r.requests for r in rows),
        sum(r.prompt_tokens for r in rows),
        sum(r.completion_tokens for r in rows),
    )


def die(meter: UsageMeter) -> None:
    """What kill -9 leaves: the files as written, their locks released, nothing flushed."""
    journal = meter._journal
    for file in [journal._current, *meter._sealed]:
        os.close(file.fd)


async def test_a_killed_replicas_usage_is_written_by_the_next(store: KeyStore, tmp_path):
    user = await store.create_user("ada@example.com")
    key = await store.create_key(user.id)
    first = UsageMeter(store, flush_every_s=3600, journal=UsageJournal(tmp_path))
    for _ in range(40):
        first.record(key.id, "ServiceAi-Fast", 10, 5)
    await first.flush()  # written: its file goes
    for _ in range(7):
        first.record(key.id, "ServiceAi-Pro", 3, 2)
    die(first)
    assert await used(store, user.id) == (40, 400, 200)

    # A replica beside the dead one: the file of the living one (this) is not claimed twice.
    second = UsageMeter(store, flush_every_s=3600, journal=UsageJournal(tmp_path))
    third = UsageMeter(store, flush_every_s=3600, journal=UsageJournal(tmp_path))
    second._claim_orphans()
    third._claim_orphans()
    assert len(second._sealed) == 1 and third._sealed == []
    second.record(key.id, "ServiceAi-Pro", 1, 1)
    await second.flush()
    await third.flush()
    assert await used(store, user.id) == (48, 400 + 21 + 1, 200 + 14 + 1)
    await second.close()
    await third.close()
    assert list(tmp_path.glob("*.jsonl")) == []  # a clean stop leaves nothing to replay


async def test_a_store_outage_keeps_the_files_until_the_write(
    store: KeyStore, database_url: str, tmp_path, monkeypatch
):
    user = await store.create_user("ada@example.com")
    key = await store.create_key(user.id)
    meter = UsageMeter(store, flush_every_s=3600, journal=UsageJournal(tmp_path))
    meter.record(key.id, "ServiceAi-Fast", 2, 3)

    async def unavailable(_):
        raise StoreUnavailable("down")

    monkeypatch.setattr(store, "record_usage", unavailable)  # as a lost database answers
    await meter.flush()
    assert len(list(tmp_path.glob("*.jsonl"))) == 2  # the sealed one and the new one
    die(meter)
    # The replica died before the store came back: the next one writes it.
    reopened = KeyStore(await Database.open(database_url))
    try:
        nxt = UsageMeter(reopened, flush_every_s=3600, journal=UsageJournal(tmp_path))
        nxt._claim_orphans()
        await nxt.flush()
        assert await used(reopened, user.id) == (1, 2, 3)
    finally:
        await reopened.database.close()


def test_each_key_store_has_its_own_folder():
    a, b = default_folder("sqlite:///a.db"), default_folder("postgresql://db/b")
    assert a != b and a.parent == b.parent and default_folder("sqlite:///a.db") == a


async def test_a_line_cut_by_the_kill_is_skipped(store: KeyStore, tmp_path):
    user = await store.create_user("ada@example.com")
    key = await store.create_key(user.id)
    (tmp_path / "1-dead.jsonl").write_text(
        f'["{key.id}", "ServiceAi-Fast", "{today()}", 1, 4, 5]\n["{key.id}", "Servi'
    )
    meter = UsageMeter(store, flush_every_s=3600, journal=UsageJournal(tmp_path))
    meter._claim_orphans()
    await meter.flush()
    assert await used(store, user.id) == (1, 4, 5)
