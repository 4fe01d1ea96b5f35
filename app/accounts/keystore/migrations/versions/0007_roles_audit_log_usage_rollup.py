"""Operators and their audit log: a role per user ("user" for everyone already there), the
audit_log table every operator action writes to, and daily_model_usage (daily_usage summed per
day and model type, filled here from what daily_usage holds) for the usage charts.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users") as users:
        users.add_column(sa.Column("role", sa.String(16), nullable=False, server_default="user"))
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(320), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(320), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_table(
        "daily_model_usage",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("model_type", sa.String(64), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("day", "model_type", name=op.f("pk_daily_model_usage")),
    )
    op.execute(
        "INSERT INTO daily_model_usage (day, model_type, requests, prompt_tokens, "
        "completion_tokens) SELECT day, model_type, SUM(requests), SUM(prompt_tokens), "
        "SUM(completion_tokens) FROM daily_usage GROUP BY day, model_type"
    )


def downgrade() -> None:
    op.drop_table("daily_model_usage")
    op.drop_table("audit_log")
    with op.batch_alter_table("users") as users:
        users.drop_column("role")
