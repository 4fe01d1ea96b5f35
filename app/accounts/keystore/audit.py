"""The audit log: every operator action (console, CLI, admin API), written by the store in the
same transaction as the action, read newest first."""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.accounts.keystore.schemas import AuditEntry, AuditPage, unix
from app.accounts.keystore.tables import AuditRow

LAST_ID = 2**31 - 1
"""The largest id an entry can have: the table's Integer column in PostgreSQL."""


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts, and through which door: what an audit entry says of its author."""

    source: Literal["console", "cli", "admin_api"]
    name: str

    @classmethod
    def operator(cls, email: str) -> Actor:
        return cls("console", email)

    @classmethod
    def command_line(cls) -> Actor:
        try:
            return cls("cli", getpass.getuser())
        except (KeyError, OSError):  # no name for this uid (a bare container)
            return cls("cli", "unknown")

    @classmethod
    def admin_api(cls) -> Actor:
        return cls("admin_api", "admin token")


def record(
    session: AsyncSession,
    actor: Actor | None,
    action: str,
    target: str,
    detail: str | None = None,
) -> None:
    """Add an entry to `session`'s transaction; nothing when no operator acts (a user's own
    change from the console or the account API)."""
    if actor is None:
        return
    session.add(
        AuditRow(
            at=datetime.now(UTC),
            source=actor.source,
            actor=actor.name,
            action=action,
            target=target,
            detail=detail,
        )
    )


def page_query(limit: int, before: int | None):
    query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit + 1)
    return query if before is None else query.where(AuditRow.id < before)


def page_of(rows: list[AuditRow], limit: int) -> AuditPage:
    return AuditPage(
        data=[
            AuditEntry(
                id=r.id,
                at=unix(r.at),
                source=r.source,
                actor=r.actor,
                action=r.action,
                target=r.target,
                detail=r.detail,
            )
            for r in rows[:limit]
        ],
        has_more=len(rows) > limit,
    )
