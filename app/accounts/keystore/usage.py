"""Usage rows: per key, per model type, per UTC day. Written in batches, read as `UsageList`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Select, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from app.accounts.keystore.schemas import UsageRecord
from app.accounts.keystore.tables import ApiKeyRow, DailyUsageRow

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


def add_statement(dialect: str) -> Insert:
    """An insert that adds to the day's row when it exists (ON CONFLICT DO UPDATE)."""
    table = DailyUsageRow.__table__
    insert = (postgresql if dialect == "postgresql" else sqlite).insert(table)
    return insert.on_conflict_do_update(
        index_elements=[table.c.key_id, table.c.model_type, table.c.day],
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
