"""The key store's usage: tokens per key, model type and UTC day; budgets; the console's charts."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date

from sqlalchemy import func, select

from app.accounts.keystore.database import Database
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.rows import find_key, find_user
from app.accounts.keystore.schemas import Budget, UsageList, UsageTotals
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


class UsageRecords:
    """Usage, in the store's database."""

    database: Database

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
                query = query.where(ApiKeyRow.user_id == (await find_user(session, user)).id)
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
                row = await find_key(session, key_id, None)
                limit, kind, owner = row.monthly_tokens, "key", row.id
            elif user is not None:
                found = await find_user(session, user)
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
        far (replicas write every SERVICEAI_USAGE_FLUSH_S), a type's LoRA adapters (recorded
        as `Type:adapter`) within it, as its plan windows count them. Types unused today are
        absent."""
        day = today()
        totals: dict[str, UsageTotals] = {}
        for record in (await self.usage(user=user, start=day, end=day)).data:
            total = totals.setdefault(record.model.partition(":")[0], UsageTotals())
            total.requests += record.requests
            total.prompt_tokens += record.prompt_tokens
            total.completion_tokens += record.completion_tokens
            total.total_tokens += record.total_tokens
        return totals
