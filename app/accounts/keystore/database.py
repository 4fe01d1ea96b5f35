"""The key store's database: an async SQLAlchemy engine, its sessions, and its failures.

SQLite (aiosqlite) by default, PostgreSQL (asyncpg) in production. Opening a database brings
its schema to the newest revision.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, Result, event
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.accounts.keystore import migrate
from app.accounts.keystore.errors import StoreUnavailable

logger = logging.getLogger("ray.serve.serviceai")

CONNECT_TIMEOUT_S = 5
# What a database that is down, restarting, locked or out of pooled connections raises;
# everything else is a bug.
_UNAVAILABLE = (OperationalError, InterfaceError, OSError, TimeoutError, PoolTimeout)


class Database:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    @classmethod
    async def open(cls, url: str, *, migrate_to: str | None = migrate.HEAD) -> Database:
        """Connect and upgrade the schema (to `migrate_to`; None leaves it as it is)."""
        database = cls(create_engine(url))
        if migrate_to is not None:
            try:
                await migrate.upgrade(database.engine, migrate_to)
            except _UNAVAILABLE as exc:
                await database.close()
                raise unavailable(exc) from None
        return database

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A session in a transaction, committed at the end; an unreachable database is a 503."""
        async with _reachable(), self._sessions.begin() as session:
            yield session

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A bare connection for one read on the hot path: no ORM session, half the time."""
        async with _reachable(), self.engine.connect() as connection:
            yield connection

    async def close(self) -> None:
        await self.engine.dispose()


def rowcount(result: Result[Any]) -> int:
    """Rows an INSERT, UPDATE or DELETE matched (SQLAlchemy types `execute` as any statement's)."""
    return cast(CursorResult[Any], result).rowcount


def create_engine(url: str) -> AsyncEngine:
    kwargs: dict[str, Any] = {
        "hide_parameters": True,  # error messages and logs never show values (key hashes)
    }
    if url.startswith("sqlite"):
        _ensure_sqlite_folder(url)
        kwargs["connect_args"] = {"timeout": CONNECT_TIMEOUT_S}
    else:
        kwargs["connect_args"] = {
            "timeout": CONNECT_TIMEOUT_S,
            "command_timeout": CONNECT_TIMEOUT_S,
        }
        kwargs["pool_timeout"] = CONNECT_TIMEOUT_S
        # A restarted server costs a ping per checkout, not a 503 per stale pooled connection.
        kwargs["pool_pre_ping"] = True
    engine = create_async_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the ingress read while the CLI writes; busy_timeout waits for a writer's lock.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={CONNECT_TIMEOUT_S * 1000}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _ensure_sqlite_folder(url: str) -> None:
    path = url.partition(":///")[2].partition("?")[0]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)


@asynccontextmanager
async def _reachable() -> AsyncIterator[None]:
    try:
        yield
    except _UNAVAILABLE as exc:
        raise unavailable(exc) from None


def unavailable(exc: BaseException) -> StoreUnavailable:
    # Only the class name: a driver's message can quote SQL or values.
    cause = getattr(exc, "orig", None) or exc
    logger.warning("Key store unavailable: %s", type(cause).__name__)
    return StoreUnavailable("The key store is unavailable right now. Retry in a few seconds.")
