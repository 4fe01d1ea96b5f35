"""Alembic environment of the key store.

The service runs migrations itself (`app.accounts.keystore.migrate`), handing Alembic an open connection.
A developer writing a revision runs `alembic revision --autogenerate -m "..."` from the project
root (configured in pyproject.toml); then the connection comes from SERVICEAI_DATABASE_URL.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from app.accounts.keystore.tables import Base


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_from_settings() -> None:
    from app.config.settings import get_settings

    engine = create_async_engine(get_settings().database_url.get_secret_value())
    async with engine.begin() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    asyncio.run(_run_from_settings())
