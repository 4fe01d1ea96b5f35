"""Usage per key, per model type, per UTC day: requests, prompt and completion tokens.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "daily_usage",
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("model_type", sa.String(64), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key_id"], ["api_keys.id"], name=op.f("fk_daily_usage_key_id_api_keys")
        ),
        sa.PrimaryKeyConstraint("key_id", "model_type", "day", name=op.f("pk_daily_usage")),
    )
    op.create_index(op.f("ix_daily_usage_day"), "daily_usage", ["day"])


def downgrade() -> None:
    op.drop_index(op.f("ix_daily_usage_day"), table_name="daily_usage")
    op.drop_table("daily_usage")
