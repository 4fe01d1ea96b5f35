"""Stored /v1/responses replies: owner, expiry, the input the model saw and the response body.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stored_responses",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("input_items", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_stored_responses_user_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stored_responses")),
    )
    op.create_index(op.f("ix_stored_responses_user_id"), "stored_responses", ["user_id"])
    op.create_index(op.f("ix_stored_responses_expires_at"), "stored_responses", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_stored_responses_expires_at"), table_name="stored_responses")
    op.drop_index(op.f("ix_stored_responses_user_id"), table_name="stored_responses")
    op.drop_table("stored_responses")
