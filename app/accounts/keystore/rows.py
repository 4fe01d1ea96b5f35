"""Finding the key store's rows by what a caller names, and the models they are read into."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy import Select, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from app.accounts.keystore.errors import KeyNotFound, KeyStoreError, UserNotFound
from app.accounts.keystore.schemas import ApiKey, KeyLimits, Order, User, unix
from app.accounts.keystore.tables import ApiKeyRow, UserRow


def now() -> datetime:
    return datetime.now(UTC)


class Unchanged:
    """The value of an argument left out (where None means 'clear it')."""


UNCHANGED = Unchanged()


async def find_key(session: AsyncSession, key_id: str, owner_id: str | None) -> ApiKeyRow:
    row = await session.get(ApiKeyRow, key_id)
    if row is None or (owner_id is not None and row.user_id != owner_id):
        raise KeyNotFound(f"No API key with id '{key_id}'.", param="key_id")
    return row


async def find_user(session: AsyncSession, user: str) -> UserRow:
    column = UserRow.email if "@" in user else UserRow.id
    row = await session.scalar(select(UserRow).where(column == user.strip().lower()))
    if row is None:
        raise UserNotFound(f"No user with {column.key} '{user[:320]}'.", param="user")
    return row


async def page(
    session: AsyncSession,
    query: Select,
    table: type[UserRow] | type[ApiKeyRow],
    limit: int,
    after: str | None,
    order: Order = "asc",
) -> Select:
    """`limit` + 1 rows (to tell whether there are more) after the row `after`, oldest first or,
    with `desc`, newest first."""
    if after is not None:
        # Looked up within the list itself: another user's id reads as unknown, as it is here.
        found = await session.execute(
            query.with_only_columns(table.created_at, table.id).where(table.id == after)
        )
        cursor = found.first()
        if cursor is None:
            raise KeyStoreError(
                f"'after' names no item of this list: '{after[:64]}'.", param="after"
            )
        position, start = tuple_(table.created_at, table.id), tuple_(*cursor)
        query = query.where(position > start if order == "asc" else position < start)
    if order == "asc":
        return query.order_by(table.created_at, table.id).limit(limit + 1)
    return query.order_by(table.created_at.desc(), table.id.desc()).limit(limit + 1)


def user_of(row: UserRow) -> User:
    return User(
        id=row.id,
        email=row.email,
        plan=row.plan,
        created_at=unix(row.created_at),
        disabled=row.disabled_at is not None,
        disabled_at=unix(row.disabled_at),
        monthly_tokens=row.monthly_tokens,
        role=row.role,
    )


def key_of(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        id=row.id,
        user_id=row.user_id,
        name=row.name,
        display=row.display,
        created_at=unix(row.created_at),
        last_used_at=unix(row.last_used_at),
        revoked_at=unix(row.revoked_at),
        revoked=row.revoked_at is not None and row.revoked_at <= now(),
        models=None if row.models is None else json.loads(row.models),
        expires_at=row.expires_at,
        limits=KeyLimits(
            requests_per_minute=row.requests_per_minute,
            tokens_per_minute=row.tokens_per_minute,
            concurrent_requests=row.concurrent_requests,
            tokens_per_day=row.tokens_per_day,
        ),
        monthly_tokens=row.monthly_tokens,
        manage_keys=row.manage_keys,
    )
