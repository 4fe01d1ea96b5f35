"""The key store's operations: users, their keys, and the lookup behind every request."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Insert, Select, bindparam, func, insert, literal, or_, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.accounts.keystore import audit, keygen, passwords
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.database import Database
from app.accounts.keystore.errors import (
    KeyLimitReached,
    KeyNotFound,
    KeyStoreError,
    UserDisabled,
    UserExists,
    UserNotFound,
    WrongCredentials,
)
from app.accounts.keystore.schemas import (
    DEFAULT_PLAN,
    ApiKey,
    AuditPage,
    Budget,
    IssuedApiKey,
    KeyLimits,
    KeyScopes,
    Order,
    Page,
    Role,
    UsageList,
    UsageTotals,
    User,
    unix,
)
from app.accounts.keystore.tables import ApiKeyRow, DailyUsageRow, UserRow
from app.accounts.keystore.usage import (
    DailyTotal,
    TopKey,
    TopUser,
    UsageCount,
    UsageKey,
    add_model_rows,
    add_rows,
    add_statement,
    daily_totals_query,
    default_range,
    record_of,
    today,
    top_keys_query,
    top_query,
    usage_query,
)


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


def now() -> datetime:
    return datetime.now(UTC)


class Unchanged:
    """The value of an argument left out (where None means 'clear it')."""


UNCHANGED = Unchanged()


class KeyStore:
    def __init__(self, database: Database, *, max_keys_per_user: int = 50) -> None:
        self.database = database
        self.max_keys_per_user = max_keys_per_user

    # Users

    async def create_user(
        self,
        email: str,
        plan: str = DEFAULT_PLAN,
        *,
        password: str | None = None,
        disabled: bool = False,
        actor: Actor | None = None,
    ) -> User:
        """A new user; with `password`, one who can sign in to the console; `disabled`, one
        an operator has yet to enable; with `actor`, an operator's action, audited."""
        email = email.strip().lower()
        password_hash = None if password is None else await passwords.hash_password(password)
        row = UserRow(
            id=keygen.new_id("user"),
            email=email,
            plan=plan,
            created_at=now(),
            password_hash=password_hash,
            role="user",
        )
        row.disabled_at = row.created_at if disabled else None
        try:
            async with self.database.transaction() as session:
                session.add(row)
                await session.flush()  # a taken email fails here, before the audit entry
                audit.record(session, actor, "user.create", email, f"plan {plan}")
        except IntegrityError:
            raise UserExists(
                f"A user with email '{email}' already exists.", param="email"
            ) from None
        return _user(row)

    async def get_user(self, user: str) -> User:
        """A user by id or by email."""
        async with self.database.transaction() as session:
            return _user(await _find_user(session, user))

    async def list_users(
        self,
        limit: int = 100,
        after: str | None = None,
        *,
        email_contains: str | None = None,
        order: Order = "asc",
    ) -> Page[User]:
        """Users, oldest first (`desc`: newest first); with `email_contains`, those whose email
        holds that text."""
        query = select(UserRow)
        if email_contains:
            pattern = email_contains.strip().lower().replace("\\", "\\\\")
            pattern = pattern.replace("%", "\\%").replace("_", "\\_")
            query = query.where(UserRow.email.like(f"%{pattern}%", escape="\\"))
        async with self.database.transaction() as session:
            query = await _page(session, query, UserRow, limit, after, order)
            rows = list(await session.scalars(query))
        return Page[User](data=[_user(r) for r in rows[:limit]], has_more=len(rows) > limit)

    async def update_user(
        self,
        user: str,
        *,
        plan: str | None = None,
        disabled: bool | None = None,
        monthly_tokens: int | None | Unchanged = UNCHANGED,
        role: Role | None = None,
        actor: Actor | None = None,
    ) -> User:
        """Change what is given; `monthly_tokens=None` clears the user's budget. With `actor`,
        each change is an audited operator action."""
        async with self.database.transaction() as session:
            row = await _find_user(session, user)
            if plan is not None:
                audit.record(session, actor, "user.set_plan", row.email, f"{row.plan} → {plan}")
                row.plan = plan
            if disabled is not None:
                audit.record(
                    session, actor, "user.disable" if disabled else "user.enable", row.email
                )
                if disabled != (row.disabled_at is not None):
                    row.disabled_at = now() if disabled else None
            if not isinstance(monthly_tokens, Unchanged):
                audit.record(
                    session,
                    actor,
                    "user.set_budget",
                    row.email,
                    f"{row.monthly_tokens} → {monthly_tokens} tokens a month",
                )
                row.monthly_tokens = monthly_tokens
            if role is not None:
                audit.record(session, actor, "user.set_role", row.email, f"{row.role} → {role}")
                row.role = role
        return _user(row)

    async def set_password(
        self, user: str, password: str, *, end_sessions: bool = True, actor: Actor | None = None
    ) -> User:
        """Set (or replace) a user's console password: how CLI-made users get one. Every
        console session of the user ends (unless only the hash's parameters change)."""
        password_hash = await passwords.hash_password(password)
        async with self.database.transaction() as session:
            row = await _find_user(session, user)
            audit.record(session, actor, "user.set_password", row.email)
            row.password_hash = password_hash
            if end_sessions:
                row.session_version = UserRow.session_version + 1
        return await self.get_user(row.id)

    async def emails(self, user_ids: Collection[str]) -> dict[str, str]:
        """The email of each of these users (by id), in one query."""
        if not user_ids:
            return {}
        query = select(UserRow.id, UserRow.email).where(UserRow.id.in_(list(user_ids)))
        async with self.database.connection() as connection:
            return dict((await connection.execute(query)).all())

    async def session_version(self, user_id: str) -> int | None:
        """The version a console session of this user must carry; None for no such user."""
        async with self.database.connection() as connection:
            return await connection.scalar(
                select(UserRow.session_version).where(UserRow.id == user_id)
            )

    async def end_sessions(self, user_id: str) -> None:
        """End every console session of a user, on every replica (sign-out)."""
        async with self.database.transaction() as session:
            await session.execute(
                update(UserRow)
                .where(UserRow.id == user_id)
                .values(session_version=UserRow.session_version + 1)
            )

    async def check_password(self, email: str, password: str) -> User:
        """The user with this email and password (disabled or not), else WrongCredentials.

        An unknown email, a user without a password and a wrong password cost the same hash
        and give the same answer, so that sign-in tells nobody which emails have accounts.
        """
        async with self.database.transaction() as session:
            row = await session.scalar(
                select(UserRow).where(UserRow.email == email.strip().lower())
            )
        matched = await passwords.verify(None if row is None else row.password_hash, password)
        if row is None or not matched:
            raise WrongCredentials("The email or the password is not right.")
        if passwords.needs_rehash(row.password_hash):
            await self.set_password(row.id, password, end_sessions=False)
        return _user(row)

    # Keys

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
            owner = await _find_user(session, user)
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
            if inserted.rowcount == 1:
                audit.record(
                    session,
                    actor,
                    "key.create",
                    row.id,
                    f"for {owner_email}" + (f', named "{name}"' if name else ""),
                )
                return IssuedApiKey(**_key(row).model_dump(), key=issued.secret)
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
                owner = await _find_user(session, user)
                query = query.where(ApiKeyRow.user_id == owner.id)
            query = await _page(session, query, ApiKeyRow, limit, after, order)
            rows = list(await session.scalars(query))
        return Page[ApiKey](data=[_key(r) for r in rows[:limit]], has_more=len(rows) > limit)

    async def get_key(self, key_id: str, *, owner_id: str | None = None) -> ApiKey:
        async with self.database.transaction() as session:
            return _key(await _find_key(session, key_id, owner_id))

    async def revoke_key(
        self, key_id: str, *, owner_id: str | None = None, actor: Actor | None = None
    ) -> ApiKey:
        """Revoke a key (again is fine; a key in its grace period is revoked now). With
        `owner_id`, only that user's key is found."""
        async with self.database.transaction() as session:
            row = await _find_key(session, key_id, owner_id)
            audit.record(session, actor, "key.revoke", row.id)
            moment = now()
            if row.revoked_at is None or row.revoked_at > moment:
                row.revoked_at = moment
        return _key(row)

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
            row = await _find_key(session, key_id, owner_id)
            audit.record(session, actor, "key.update", row.id, ", ".join(sorted(changes)))
            scopes = _key(row).model_dump(include=set(KeyScopes.model_fields))
            _set_scopes(row, KeyScopes.model_validate({**scopes, **changes}))
        return _key(row)

    async def rotate_key(
        self,
        key_id: str,
        grace: timedelta,
        *,
        owner_id: str | None = None,
        actor: Actor | None = None,
    ) -> IssuedApiKey:
        """A new key with the old one's name and scopes; the old one keeps working for `grace`,
        then is revoked. Both in one transaction."""
        issued = keygen.issue()
        async with self.database.transaction() as session:
            old = await _find_key(session, key_id, owner_id)
            moment = now()
            if old.revoked_at is not None and old.revoked_at <= moment:
                raise KeyNotFound(
                    f"API key '{key_id}' is revoked: there is nothing to rotate.", param="key_id"
                )
            row = ApiKeyRow(
                id=keygen.new_id("key"),
                user_id=old.user_id,
                key_hash=issued.hash,
                display=issued.display,
                name=old.name,
                created_at=moment,
            )
            _set_scopes(
                row,
                KeyScopes.model_validate(_key(old).model_dump(include=set(KeyScopes.model_fields))),
            )
            ends = moment + grace
            old.revoked_at = ends if old.revoked_at is None else min(old.revoked_at, ends)
            session.add(row)
            audit.record(
                session,
                actor,
                "key.rotate",
                old.id,
                f"new key {row.id}; the old one works {int(grace.total_seconds())} s more",
            )
        return IssuedApiKey(**_key(row).model_dump(), key=issued.secret)

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
        key = _key(row)
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

    async def audit_log(self, limit: int = 50, before: int | None = None) -> AuditPage:
        """Operator actions, newest first; `before` an entry's id for the page after it."""
        async with self.database.transaction() as session:
            rows = list(await session.scalars(audit.page_query(limit, before)))
        return audit.page_of(rows, limit)

    async def users_per_plan(self) -> dict[str, int]:
        """How many users each plan name in the store has (disabled users included)."""
        query = select(UserRow.plan, func.count()).group_by(UserRow.plan)
        async with self.database.connection() as connection:
            return {plan: count for plan, count in (await connection.execute(query)).all()}

    # Usage

    async def record_usage(self, counts: Mapping[UsageKey, UsageCount]) -> None:
        """Add many keys' usage to their day's rows, in one statement."""
        if not counts:
            return
        async with self.database.transaction() as session:
            connection = await session.connection()
            dialect = self.database.dialect
            await connection.execute(add_statement(dialect), add_rows(counts))
            await connection.execute(add_statement(dialect, per_model=True), add_model_rows(counts))

    async def usage(
        self,
        *,
        user: str | None = None,
        key_id: str | None = None,
        start: date | None = None,
        end: date | None = None,
    ) -> UsageList:
        """Usage per key, model type and UTC day, from `start` to `end` (both included; by
        default the last 30 days), of everyone, of one user (id or email) or of one key.

        The CLI, the admin API and the account API all read usage through this method.
        """
        start, end = default_range(start, end)
        if start > end:
            raise KeyStoreError(f"start_date {start} is after end_date {end}.", param="start_date")
        query = usage_query(start, end)
        async with self.database.transaction() as session:
            if user is not None:
                query = query.where(ApiKeyRow.user_id == (await _find_user(session, user)).id)
            if key_id is not None:
                query = query.where(DailyUsageRow.key_id == key_id)
            rows = (await session.execute(query)).all()
        return UsageList(
            start_date=start,
            end_date=end,
            data=[record_of(row, owner) for row, owner in rows],
            budget=await self.budget(user=user, key_id=key_id),
        )

    async def monthly_tokens(self, kind: str, owner: str) -> int:
        """Tokens (prompt and completion) that a user's keys (`kind` "user") or one key ("key")
        used this UTC month, as written so far: what a budget's window starts from."""
        used = func.coalesce(
            func.sum(DailyUsageRow.prompt_tokens + DailyUsageRow.completion_tokens), 0
        )
        query = select(used).where(DailyUsageRow.day >= today().replace(day=1))
        if kind == "user":
            query = query.join(ApiKeyRow, ApiKeyRow.id == DailyUsageRow.key_id).where(
                ApiKeyRow.user_id == owner
            )
        else:
            query = query.where(DailyUsageRow.key_id == owner)
        async with self.database.connection() as connection:
            return int(await connection.scalar(query) or 0)

    async def budget(self, *, user: str | None = None, key_id: str | None = None) -> Budget | None:
        """The monthly budget of a user or a key, with what was used of it this UTC month
        (as written so far); None without one."""
        async with self.database.transaction() as session:
            if key_id is not None:
                row = await _find_key(session, key_id, None)
                limit, kind, owner = row.monthly_tokens, "key", row.id
            elif user is not None:
                found = await _find_user(session, user)
                limit, kind, owner = found.monthly_tokens, "user", found.id
            else:
                return None
        if limit is None:
            return None
        used = await self.monthly_tokens(kind, owner)
        return Budget(
            month=today().strftime("%Y-%m"),
            monthly_tokens=limit,
            used=used,
            left=max(0, limit - used),
        )

    async def daily_totals(
        self, start: date, end: date, *, user_id: str | None = None
    ) -> list[DailyTotal]:
        """Usage per UTC day and model type from `start` to `end`, of everyone or one user,
        summed in the database (what the console's charts draw)."""
        async with self.database.connection() as connection:
            rows = await connection.execute(daily_totals_query(start, end, user_id))
            return [DailyTotal(day, model, int(r), int(p), int(c)) for day, model, r, p, c in rows]

    async def top(
        self, start: date, end: date, limit: int = 10
    ) -> tuple[list[TopUser], list[TopKey]]:
        """The users and the keys that used the most tokens from `start` to `end`."""
        async with self.database.connection() as connection:
            ranked = (await connection.execute(top_query(start, end, limit))).all()
            user_ids = [i for kind, i, _, _ in ranked if kind == "user"]
            key_ids = [i for kind, i, _, _ in ranked if kind == "key"]
            keys = {
                row.id: row
                for row in await connection.execute(
                    select(
                        ApiKeyRow.id, ApiKeyRow.display, ApiKeyRow.name, ApiKeyRow.user_id
                    ).where(ApiKeyRow.id.in_(key_ids))
                )
            }
            emails = dict(
                (
                    await connection.execute(
                        select(UserRow.id, UserRow.email).where(
                            UserRow.id.in_({*user_ids, *(k.user_id for k in keys.values())})
                        )
                    )
                ).all()
            )
        users = [
            TopUser(i, emails[i], int(r), int(t)) for kind, i, r, t in ranked if kind == "user"
        ]
        top_keys = [
            TopKey(
                i,
                keys[i].display,
                keys[i].name,
                keys[i].user_id,
                emails[keys[i].user_id],
                int(r),
                int(t),
            )
            for kind, i, r, t in ranked
            if kind == "key"
        ]
        return users, top_keys

    async def top_keys(
        self, start: date, end: date, limit: int = 10, *, user_id: str | None = None
    ) -> list[TopKey]:
        """The keys (of everyone, or of one user) that used the most tokens."""
        async with self.database.connection() as connection:
            rows = await connection.execute(top_keys_query(start, end, limit, user_id))
            return [TopKey(k, d, n, u, e, int(r), int(t)) for k, d, n, u, e, r, t in rows]

    async def usage_today(self, user: str) -> dict[str, UsageTotals]:
        """A user's usage today (UTC) per model type, all their keys together, as written so
        far (replicas write every SERVICEAI_USAGE_FLUSH_S). Types unused today are absent."""
        day = today()
        totals: dict[str, UsageTotals] = {}
        for record in (await self.usage(user=user, start=day, end=day)).data:
            total = totals.setdefault(record.model, UsageTotals())
            total.requests += record.requests
            total.prompt_tokens += record.prompt_tokens
            total.completion_tokens += record.completion_tokens
            total.total_tokens += record.total_tokens
        return totals


async def _find_key(session: AsyncSession, key_id: str, owner_id: str | None) -> ApiKeyRow:
    row = await session.get(ApiKeyRow, key_id)
    if row is None or (owner_id is not None and row.user_id != owner_id):
        raise KeyNotFound(f"No API key with id '{key_id}'.", param="key_id")
    return row


SCOPE_COLUMNS = (
    "models",
    "expires_at",
    "requests_per_minute",
    "tokens_per_minute",
    "concurrent_requests",
    "tokens_per_day",
    "monthly_tokens",
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


async def _find_user(session: AsyncSession, user: str) -> UserRow:
    column = UserRow.email if "@" in user else UserRow.id
    row = await session.scalar(select(UserRow).where(column == user.strip().lower()))
    if row is None:
        raise UserNotFound(f"No user with {column.key} '{user[:320]}'.", param="user")
    return row


async def _page(
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


def _insert_within_limit(row: ApiKeyRow, max_keys: int) -> Insert:
    """INSERT the key only while its owner holds fewer than `max_keys` active keys."""
    columns = ("id", "user_id", "key_hash", "display", "name", "created_at", *SCOPE_COLUMNS)
    active = (
        select(func.count())
        .select_from(ApiKeyRow)
        .where(ApiKeyRow.user_id == row.user_id, ApiKeyRow.revoked_at.is_(None))
        .scalar_subquery()
    )
    values = select(
        *(literal(getattr(row, c), getattr(ApiKeyRow, c).type).label(c) for c in columns)
    ).where(active < max_keys)
    return insert(ApiKeyRow).from_select(list(columns), values)


def _user(row: UserRow) -> User:
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


def _key(row: ApiKeyRow) -> ApiKey:
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
    )
