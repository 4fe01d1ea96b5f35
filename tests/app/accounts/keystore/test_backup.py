"""The key store's backup and restore, exactly as docs/operations.md gives them: SQLite's online
`.backup`, PostgreSQL's `pg_dump` restored into a fresh database. The restored store opens at
the current schema and answers every key as the original did: a live key authenticates as its
user, a revoked one is refused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.accounts.keystore.database import Database
from app.openai.errors import ApiError


def libpq(database_url: str) -> str:
    return database_url.replace("+asyncpg", "")


async def backed_up_and_restored(database_url: str, tmp_path: Path, postgres) -> str:
    """The store's backup, restored as the runbook restores it; the restored store's URL."""
    if database_url.startswith("sqlite"):
        source = database_url.partition(":///")[2]
        backup = tmp_path / "keys-backup.db"
        subprocess.run(["sqlite3", source, f".backup '{backup}'"], check=True)
        restored = tmp_path / "restored" / "keys.db"
        restored.parent.mkdir()
        shutil.copyfile(backup, restored)
        return f"sqlite+aiosqlite:///{restored}"
    dump = tmp_path / "serviceai.dump"
    subprocess.run(
        ["pg_dump", "--format=custom", "--no-owner", f"--file={dump}", libpq(database_url)],
        check=True,
    )
    fresh = await postgres.create()
    subprocess.run(["pg_restore", "--no-owner", f"--dbname={libpq(fresh)}", dump], check=True)
    return fresh


async def test_a_restored_backup_serves_the_keys_it_held(
    store: KeyStore, database_url, tmp_path, postgres
):
    ada = await store.create_user("ada@example.com")
    live = await store.create_key(ada.id, "live")
    revoked = await store.create_key(ada.id, "revoked")
    await store.revoke_key(revoked.id)

    restored_url = await backed_up_and_restored(database_url, tmp_path, postgres)

    database = await Database.open(restored_url)  # migrates to the current schema: a no-op
    try:
        verifier = KeyVerifier(KeyStore(database, max_keys_per_user=5))
        caller = await verifier.verify(live.key)
        assert (caller.user_id, caller.key_id) == (ada.id, live.id)
        with pytest.raises(ApiError) as refused:
            await verifier.verify(revoked.key)
        assert refused.value.status == 401
    finally:
        await database.close()
