"""The tables of the key store (SQLAlchemy ORM). Alembic revisions in migrations/ create them."""

from __future__ import annotations

from datetime import UTC, date, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    DateTime,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names, so that migrations can refer to them on every database.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on every database (SQLite keeps no time zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class UserRow(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    plan: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    disabled_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # An argon2id hash for the console's sign-in; None for users made by the CLI or admin API.
    password_hash: Mapped[str | None] = mapped_column(String(255))
    # Console sessions carry the version they began under; bumping it ends them all.
    session_version: Mapped[int] = mapped_column(Integer(), default=0, server_default="0")
    # Tokens all the user's keys may use in a UTC calendar month; None: the plan's limits only.
    monthly_tokens: Mapped[int | None] = mapped_column(BigInteger())
    # "admin": an operator, who may use the console's operator pages; "user": everyone else.
    role: Mapped[str] = mapped_column(String(16), default="user", server_default="user")


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    display: Mapped[str] = mapped_column(String(16))
    name: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # A future time for a key rotated away: valid until then (its grace), revoked from then.
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # Scopes, all optional: the model types it may call (a JSON list), when it expires, its own
    # limits beside its user's plan (the tighter wins), and a monthly token budget.
    models: Mapped[str | None] = mapped_column(Text())
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    requests_per_minute: Mapped[int | None] = mapped_column(Integer())
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger())
    concurrent_requests: Mapped[int | None] = mapped_column(Integer())
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger())
    monthly_tokens: Mapped[int | None] = mapped_column(BigInteger())
    # It may create, change, rotate and revoke its user's keys through the account API.
    manage_keys: Mapped[bool] = mapped_column(Boolean(), default=True, server_default=true())


class DailyUsageRow(Base):
    """What one key used of one model type on one UTC day; replicas add to it in batches."""

    __tablename__ = "daily_usage"

    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), primary_key=True)
    model_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    day: Mapped[date] = mapped_column(Date(), primary_key=True, index=True)
    requests: Mapped[int] = mapped_column(BigInteger())
    prompt_tokens: Mapped[int] = mapped_column(BigInteger())
    completion_tokens: Mapped[int] = mapped_column(BigInteger())


class DailyModelUsageRow(Base):
    """What everyone used of one model type on one UTC day: `daily_usage` summed as it is
    written (the same transaction), so that charts over all users read a few hundred rows."""

    __tablename__ = "daily_model_usage"

    day: Mapped[date] = mapped_column(Date(), primary_key=True)
    model_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger())
    prompt_tokens: Mapped[int] = mapped_column(BigInteger())
    completion_tokens: Mapped[int] = mapped_column(BigInteger())


class StoredResponseRow(Base):
    """A /v1/responses reply (finished, or a background one on its way) and the input the
    model saw, owned by one user.

    `input_items` is the whole conversation up to this turn (previous turns replayed), so a
    `previous_response_id` resolves with one read; `body` is the response object as returned.
    """

    __tablename__ = "stored_responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger())
    input_items: Mapped[str] = mapped_column(Text())
    body: Mapped[str] = mapped_column(Text())
    status: Mapped[str] = mapped_column(String(16), server_default="completed")
    """The body's status, kept apart so that a background response moves on by one
    conditional UPDATE (queued, in_progress, then completed, incomplete, failed or cancelled)."""


class AuditRow(Base):
    """One operator action: who did what to whom, when, and through which door.

    Written in the same transaction as the action itself, so that neither exists without the
    other. Newest first is descending `id`.
    """

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer(), primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime())
    source: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(320))
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(320))
    detail: Mapped[str | None] = mapped_column(Text())


class AdapterRow(Base):
    """A LoRA adapter an operator registered on a model type while the service runs; clients
    call it as `model_type:name`, and a replica loads it from `path` the first time one does."""

    __tablename__ = "lora_adapters"

    model_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    path: Mapped[str] = mapped_column(Text())
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
