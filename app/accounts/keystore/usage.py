"""Usage rows: per key, per model type, per UTC day. Written in batches, read as `UsageList`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import CompoundSelect, Select, func, literal, select, union_all
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from app.accounts.keystore.schemas import UsageRecord
from app.accounts.keystore.tables import ApiKeyRow, DailyModelUsageRow, DailyUsageRow, UserRow

DEFAULT_DAYS = 30


@dataclass(frozen=True, slots=True)
class UsageKey:
    key_id: str
    model_type: str
    day: date


@dataclass(slots=True)
class UsageCount:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: UsageCount) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


def today() -> date:
    return datetime.now(UTC).date()


def default_range(start: date | None, end: date | None) -> tuple[date, date]:
    """Up to today (UTC), over the last DEFAULT_DAYS days unless `start` says otherwise."""
    end = end or today()
    # Clamped at date.min: an end_date in the first days of year 1 is valid input, not a 500.
    return start or end - timedelta(days=min(DEFAULT_DAYS - 1, (end - date.min).days)), end


def add_statement(dialect: str, *, per_model: bool = False) -> Insert:
    """An insert that adds to the day's row when it exists (ON CONFLICT DO UPDATE): of a key
    (`daily_usage`), or with `per_model` of everyone (`daily_model_usage`)."""
    table = (DailyModelUsageRow if per_model else DailyUsageRow).__table__
    insert = (postgresql if dialect == "postgresql" else sqlite).insert(table)
    return insert.on_conflict_do_update(
        index_elements=[
            c for c in (table.c.get("key_id"), table.c.model_type, table.c.day) if c is not None
        ],
        set_={
            column: table.c[column] + insert.excluded[column]
            for column in ("requests", "prompt_tokens", "completion_tokens")
        },
    )


def add_rows(counts: Mapping[UsageKey, UsageCount]) -> list[dict[str, object]]:
    return [
        {
            "key_id": key.key_id,
            "model_type": key.model_type,
            "day": key.day,
            "requests": count.requests,
            "prompt_tokens": count.prompt_tokens,
            "completion_tokens": count.completion_tokens,
        }
        for key, count in counts.items()
    ]


def add_model_rows(counts: Mapping[UsageKey, UsageCount]) -> list[dict[str, object]]:
    """The same counts summed per model type and day, for `daily_model_usage`."""
    totals: dict[tuple[str, date], UsageCount] = {}
    for key, count in counts.items():
        totals.setdefault((key.model_type, key.day), UsageCount()).add(count)
    return [
        {
            "model_type": model,
            "day": day,
            "requests": count.requests,
            "prompt_tokens": count.prompt_tokens,
            "completion_tokens": count.completion_tokens,
        }
        for (model, day), count in totals.items()
    ]


def usage_query(start: date, end: date) -> Select:
    return (
        select(DailyUsageRow, ApiKeyRow.user_id)
        .join(ApiKeyRow, ApiKeyRow.id == DailyUsageRow.key_id)
        .where(DailyUsageRow.day >= start, DailyUsageRow.day <= end)
        .order_by(DailyUsageRow.day, DailyUsageRow.key_id, DailyUsageRow.model_type)
    )


def record_of(row: DailyUsageRow, user_id: str) -> UsageRecord:
    return UsageRecord(
        date=row.day,
        user_id=user_id,
        key_id=row.key_id,
        model=row.model_type,
        requests=row.requests,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        total_tokens=row.prompt_tokens + row.completion_tokens,
    )


@dataclass(frozen=True, slots=True)
class DailyTotal:
    """One model type's usage on one UTC day, summed over the keys asked about."""

    day: date
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class TopUser:
    user_id: str
    email: str
    requests: int
    total_tokens: int


@dataclass(frozen=True, slots=True)
class TopKey:
    key_id: str
    display: str
    name: str | None
    user_id: str
    email: str
    requests: int
    total_tokens: int


_TOKENS = func.sum(DailyUsageRow.prompt_tokens + DailyUsageRow.completion_tokens)
_REQUESTS = func.sum(DailyUsageRow.requests)


def daily_totals_query(start: date, end: date, user_id: str | None) -> Select:
    """Per day and model type: of everyone, the rows of `daily_model_usage`; of one user, their
    keys' rows of `daily_usage` summed in the database."""
    if user_id is None:
        table = DailyModelUsageRow
        return (
            select(
                table.day,
                table.model_type,
                table.requests,
                table.prompt_tokens,
                table.completion_tokens,
            )
            .where(table.day >= start, table.day <= end)
            .order_by(table.day, table.model_type)
        )
    keys = select(ApiKeyRow.id).where(ApiKeyRow.user_id == user_id)
    return (
        select(
            DailyUsageRow.day,
            DailyUsageRow.model_type,
            _REQUESTS,
            func.sum(DailyUsageRow.prompt_tokens),
            func.sum(DailyUsageRow.completion_tokens),
        )
        .where(DailyUsageRow.day >= start, DailyUsageRow.day <= end)
        .where(DailyUsageRow.key_id.in_(keys))
        .group_by(DailyUsageRow.day, DailyUsageRow.model_type)
        .order_by(DailyUsageRow.day, DailyUsageRow.model_type)
    )


def top_keys_query(start: date, end: date, limit: int, user_id: str | None) -> Select:
    """The keys that used the most tokens, summed per key first, then joined to their owner."""
    sums = (
        select(DailyUsageRow.key_id, _REQUESTS.label("requests"), _TOKENS.label("tokens"))
        .where(DailyUsageRow.day >= start, DailyUsageRow.day <= end)
        .group_by(DailyUsageRow.key_id)
    )
    if user_id is not None:
        keys = select(ApiKeyRow.id).where(ApiKeyRow.user_id == user_id)
        sums = sums.where(DailyUsageRow.key_id.in_(keys))
    per_key = sums.order_by(_TOKENS.desc(), DailyUsageRow.key_id).limit(limit).subquery()
    return (
        select(
            ApiKeyRow.id,
            ApiKeyRow.display,
            ApiKeyRow.name,
            ApiKeyRow.user_id,
            UserRow.email,
            per_key.c.requests,
            per_key.c.tokens,
        )
        .join(per_key, per_key.c.key_id == ApiKeyRow.id)
        .join(UserRow, UserRow.id == ApiKeyRow.user_id)
        .order_by(per_key.c.tokens.desc(), ApiKeyRow.id)
    )


def top_query(start: date, end: date, limit: int) -> CompoundSelect:
    """The top `limit` users and the top `limit` keys by tokens, in one statement over one
    sum per key (a CTE, computed once): rows of (kind "user" or "key", id, requests, tokens)."""
    per_key = (
        select(DailyUsageRow.key_id, _REQUESTS.label("requests"), _TOKENS.label("tokens"))
        .where(DailyUsageRow.day >= start, DailyUsageRow.day <= end)
        .group_by(DailyUsageRow.key_id)
        .cte("per_key")
    )
    user_tokens = func.sum(per_key.c.tokens)
    users = (
        select(
            ApiKeyRow.user_id.label("id"),
            func.sum(per_key.c.requests).label("requests"),
            user_tokens.label("tokens"),
        )
        .join(per_key, per_key.c.key_id == ApiKeyRow.id)
        .group_by(ApiKeyRow.user_id)
        .order_by(user_tokens.desc(), ApiKeyRow.user_id)
        .limit(limit)
        .subquery()
    )
    keys = (
        select(per_key.c.key_id.label("id"), per_key.c.requests, per_key.c.tokens)
        .order_by(per_key.c.tokens.desc(), per_key.c.key_id)
        .limit(limit)
        .subquery()
    )
    return union_all(
        select(literal("user").label("kind"), users.c.id, users.c.requests, users.c.tokens),
        select(literal("key").label("kind"), keys.c.id, keys.c.requests, keys.c.tokens),
    )
