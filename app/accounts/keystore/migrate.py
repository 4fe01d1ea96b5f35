"""Bring the key store's schema to the newest Alembic revision, safely from many processes.

Every ingress replica and every CLI call runs this when it opens the store. On PostgreSQL the
upgrade runs in one transaction behind an advisory lock, so replicas starting together wait for
the first one and then find nothing to do. On SQLite (one machine) a file lock does the same.

A store already at a revision this release does not know (a newer release migrated it: a
rolling upgrade's old replicas, or a rollback) is served as it is: every migration only adds
(tables, indexes, columns nullable or with a default), so an older release's queries still hold
(tests/app/accounts/keystore/test_migrations.py checks both; docs/operations.md, "Upgrades").
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import ResolutionError
from alembic.util import CommandError
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
HEAD = "head"
# Any fixed 64-bit number unique to this application's schema upgrades.
_PG_LOCK_ID = 0x5E41_CE41_0000_0001


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


async def upgrade(engine: AsyncEngine, revision: str = HEAD) -> None:
    """Upgrade the schema to `revision` (default: the newest)."""
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        lock_path = Path(database).with_name(Path(database).name + ".migrate-lock")
        async with _file_lock(lock_path):
            await _upgrade_locked(engine, revision)
    else:
        await _upgrade_locked(engine, revision)


async def _upgrade_locked(engine: AsyncEngine, revision: str) -> None:
    async with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            await connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
        await connection.run_sync(_run_alembic, revision)


def _run_alembic(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    current = MigrationContext.configure(connection).get_current_revision()
    scripts = ScriptDirectory.from_config(config)
    if revision == HEAD and current is not None and not _known(scripts, current):
        logger.warning(
            "The key store's schema is at revision %s, newer than this release's %s: "
            "serving on it unchanged (migrations only add).",
            current,
            scripts.get_current_head(),
        )
        return
    command.upgrade(config, revision)


def _known(scripts: ScriptDirectory, revision: str) -> bool:
    try:
        return scripts.get_revision(revision) is not None
    except (ResolutionError, CommandError):  # Alembic wraps the one in the other
        return False


@asynccontextmanager
async def _file_lock(path: Path) -> AsyncIterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        await asyncio.to_thread(fcntl.flock, handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
