"""Users' console passwords (argon2id hashes); users made before have none until one is set.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users") as users:
        users.add_column(sa.Column("password_hash", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("users") as users:
        users.drop_column("password_hash")
