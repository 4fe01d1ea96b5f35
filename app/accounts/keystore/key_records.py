"""The key store's API keys: issued (hashed), scoped, rotated, revoked, and looked up per request."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Insert, Select, bindparam, func, insert, literal, or_, select, update

from app.accounts.keystore import audit, keygen
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.database import Database, rowcount
from app.accounts.keystore.errors import KeyLimitReached, KeyNotFound, UserDisabled
from app.accounts.keystore.rows import find_key, find_user, key_of, now, page
from app.accounts.keystore.schemas import ApiKey, IssuedApiKey, KeyLimits, KeyScopes, Order, Page
from app.accounts.keystore.tables import ApiKeyRow, UserRow


@dataclass(frozen=True, slots=True)
class KeyOwner:
    """What a request's key resolves to: enough to accept or refuse it, and for limits."""

    key_id: str
    key_hash: str
    user_id: str
    plan: str
    revoked: bool
    user_disabled: bool
    scopes: KeyScopes
    revokes_at: datetime | None = None
    """A key rotated away: valid until then."""
    user_monthly_tokens: int | None = None


SCOPE_COLUMNS = (
    "models",
    "expires_at",
    "requests_per_minute",
    "tokens_per_minute",
    "concurrent_requests",
    "tokens_per_day",
    "monthly_tokens",
    "manage_keys",
)


class KeyRecords:
    """API keys, in the store's database."""

    database: Database
    max_keys_per_user: int

    async def create_key(
        self,
        user: str,
        name: str | None = None,
        scopes: KeyScopes | None = None,
        *,
        actor: Actor | None = None,
    ) -> IssuedApiKey:
        issued = keygen.issue()
        async with self.database.transaction() as session:
            owner = await find_user(session, user)
            if owner.disabled_at is not None:
                raise UserDisabled(f"User {owner.id} is disabled: enable it before adding keys.")
            owner_id, owner_email = owner.id, owner.email
        row = ApiKeyRow(
            id=keygen.new_id("key"),
            user_id=owner_id,
            key_hash=issued.hash,
            display=issued.display,
            name=name,
            created_at=now(),
        )
        _set_scopes(row, scopes or KeyScopes())
        async with self.database.transaction() as session:
            if self.database.dialect == "postgresql":
                # Parallel creates of one user queue here, so each sees the others' keys.
                await session.execute(
                    select(UserRow.id).where(UserRow.id == owner_id).with_for_update()
                )
            # One statement: SQLite takes its write lock before the count, so it is atomic.
            inserted = await session.execute(_insert_within_limit(row, self.max_keys_per_user))
            if rowcount(inserted) == 1:
                audit.record(
                    session,
                    actor,
                    "key.create",
                    row.id,
                    f"for {owner_email}" + (f', named "{name}"' if name else ""),
                )
                return IssuedApiKey(**key_of(row).model_dump(), key=issued.secret)
        raise KeyLimitReached(
            f"User {owner_id} already holds {self.max_keys_per_user} active keys, the most "
            "allowed. Revoke one first."
        )

    async def list_keys(
        self,
        user: str | None = None,
        limit: int = 100,
        after: str | None = None,
        order: Order = "asc",
    ) -> Page[ApiKey]:
        """Keys (every user's, or `user`'s), oldest first (`desc`: newest first)."""
        async with self.database.transaction() as session:
            query = select(ApiKeyRow)
            if user is not None:
                owner = await find_user(session, user)
                query = query.where(ApiKeyRow.user_id == owner.id)
            query = await page(session, query, ApiKeyRow, limit, after, order)
            rows = list(await session.scalars(query))
        return Page[ApiKey](data=[key_of(r) for r in rows[:limit]], has_more=len(rows) > limit)

    async def get_key(self, key_id: str, *, owner_id: str | None = None) -> ApiKey:
        async with self.database.transaction() as session:
            return key_of(await find_key(session, key_id, owner_id))

    async def revoke_key(
        self, key_id: str, *, owner_id: str | None = None, actor: Actor | None = None
    ) -> ApiKey:
        """Revoke a key (again is fine; a key in its grace period is revoked now). With
        `owner_id`, only that user's key is found."""
        async with self.database.transaction() as session:
            row = await find_key(session, key_id, owner_id)
            audit.record(session, actor, "key.revoke", row.id)
            moment = now()
            if row.revoked_at is None or row.revoked_at > moment:
                row.revoked_at = moment
        return key_of(row)

    async def update_key(
        self,
        key_id: str,
        changes: Mapping[str, object],
        *,
        owner_id: str | None = None,
        actor: Actor | None = None,
    ) -> ApiKey:
        """Replace the scopes named in `changes` (a KeyScopes field each; None clears)."""
        async with self.database.transaction() as session:
            row = await find_key(session, key_id, owner_id)
            audit.record(session, actor, "key.update", row.id, ", ".join(sorted(changes)))
            scopes = key_of(row).model_dump(include=set(KeyScopes.model_fields))
            _set_scopes(row, KeyScopes.model_validate({**scopes, **changes}))
        return key_of(row)

    async def rotate_key(
        self,
        key_id: str,
        grace: timedelta,
        *,
        owner_id: str | None = None,
        actor: Actor | None = None,
        scopes: Callable[[KeyScopes], KeyScopes] | None = None,
    ) -> IssuedApiKey:
        """A new key with the old one's name and scopes (`scopes` of them, when given); the old
        one keeps working for `grace`, then is revoked. Both in one transaction; the new key
        counts against the user's most keys while the old one is in its grace."""
        issued = keygen.issue()
        async with self.database.transaction() as session:
            old = await find_key(session, key_id, owner_id)
            if self.database.dialect == "postgresql":
                await session.execute(
                    select(UserRow.id).where(UserRow.id == old.user_id).with_for_update()
                )
            moment = now()
            if old.revoked_at is not None and old.revoked_at <= moment:
                raise KeyNotFound(
                    f"API key '{key_id}' is revoked: there is nothing to rotate.", param="key_id"
                )
            ends = moment + grace
            old.revoked_at = ends if old.revoked_at is None else min(old.revoked_at, ends)
            # Written first: SQLite takes its write lock here, so the count below is atomic.
            await session.flush()
            if await session.scalar(_active_keys(old.user_id)) >= self.max_keys_per_user:
                raise KeyLimitReached(
                    f"User {old.user_id} already holds {self.max_keys_per_user} active keys "
                    "(a key in a rotation's grace counts), the most allowed: revoke one first, "
                    "or rotate with grace_seconds 0."
                )
            kept = KeyScopes.model_validate(
                key_of(old).model_dump(include=set(KeyScopes.model_fields))
            )
            row = ApiKeyRow(
                id=keygen.new_id("key"),
                user_id=old.user_id,
                key_hash=issued.hash,
                display=issued.display,
                name=old.name,
                created_at=moment,
            )
            _set_scopes(row, kept if scopes is None else scopes(kept))
            session.add(row)
            audit.record(
                session,
                actor,
                "key.rotate",
                old.id,
                f"new key {row.id}; the old one works {int(grace.total_seconds())} s more",
            )
        return IssuedApiKey(**key_of(row).model_dump(), key=issued.secret)

    async def find_key(self, key_hash: str) -> KeyOwner | None:
        """The owner of the key with this hash, revoked or not; None for an unknown key."""
        query = (
            select(ApiKeyRow, UserRow.plan, UserRow.disabled_at, UserRow.monthly_tokens)
            .join(UserRow, UserRow.id == ApiKeyRow.user_id)
            .where(ApiKeyRow.key_hash == key_hash)
        )
        async with self.database.transaction() as session:
            found = (await session.execute(query)).first()
        if found is None:
            return None
        row, plan, disabled_at, user_monthly_tokens = found
        key = key_of(row)
        return KeyOwner(
            key_id=row.id,
            key_hash=row.key_hash,
            user_id=row.user_id,
            plan=plan,
            revoked=key.revoked,
            user_disabled=disabled_at is not None,
            scopes=KeyScopes.model_validate(key.model_dump(include=set(KeyScopes.model_fields))),
            revokes_at=None if key.revoked else row.revoked_at,
            user_monthly_tokens=user_monthly_tokens,
        )

    async def record_last_used(self, used: Mapping[str, datetime]) -> None:
        """Write many keys' last-used times in one statement (never moving one back)."""
        if not used:
            return
        statement = (
            update(ApiKeyRow)
            .where(
                ApiKeyRow.id == bindparam("key_id"),
                or_(
                    ApiKeyRow.last_used_at.is_(None),
                    ApiKeyRow.last_used_at < bindparam("used_at"),
                ),
            )
            .values(last_used_at=bindparam("used_at"))
        )
        async with self.database.transaction() as session:
            connection = await session.connection()
            await connection.execute(
                statement, [{"key_id": k, "used_at": t} for k, t in used.items()]
            )


def _set_scopes(row: ApiKeyRow, scopes: KeyScopes) -> None:
    row.models = None if scopes.models is None else json.dumps(scopes.models)
    row.expires_at = scopes.expires_at
    limits = scopes.limits or KeyLimits()
    row.requests_per_minute = limits.requests_per_minute
    row.tokens_per_minute = limits.tokens_per_minute
    row.concurrent_requests = limits.concurrent_requests
    row.tokens_per_day = limits.tokens_per_day
    row.monthly_tokens = scopes.monthly_tokens
    row.manage_keys = scopes.manage_keys


def _active_keys(user_id: str) -> Select:
    """How many keys of the user work now: not revoked, or rotated away and in their grace."""
    return (
        select(func.count())
        .select_from(ApiKeyRow)
        .where(
            ApiKeyRow.user_id == user_id,
            or_(ApiKeyRow.revoked_at.is_(None), ApiKeyRow.revoked_at > now()),
        )
    )


def _insert_within_limit(row: ApiKeyRow, max_keys: int) -> Insert:
    """INSERT the key only while its owner holds fewer than `max_keys` active keys."""
    columns = ("id", "user_id", "key_hash", "display", "name", "created_at", *SCOPE_COLUMNS)
    active = _active_keys(row.user_id).scalar_subquery()
    values = select(
        *(literal(getattr(row, c), getattr(ApiKeyRow, c).type).label(c) for c in columns)
    ).where(active < max_keys)
    return insert(ApiKeyRow).from_select(list(columns), values)
