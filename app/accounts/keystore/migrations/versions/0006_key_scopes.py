"""Keys an operator can scope: allowed model types, an expiry, the key's own limits and a
monthly token budget; a monthly token budget per user. Every new column is nullable: an
existing key keeps all of its user's rights, as before.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.accounts.keystore.tables import UtcDateTime

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY_COLUMNS = (
    ("models", sa.Text()),
    ("expires_at", UtcDateTime()),
    ("requests_per_minute", sa.Integer()),
    ("tokens_per_minute", sa.BigInteger()),
    ("concurrent_requests", sa.Integer()),
    ("tokens_per_day", sa.BigInteger()),
    ("monthly_tokens", sa.BigInteger()),
)


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as keys:
        for name, type_ in KEY_COLUMNS:
            keys.add_column(sa.Column(name, type_, nullable=True))
    with op.batch_alter_table("users") as users:
        users.add_column(sa.Column("monthly_tokens", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("users") as users:
        users.drop_column("monthly_tokens")
    with op.batch_alter_table("api_keys") as keys:
        for name, _ in reversed(KEY_COLUMNS):
            keys.drop_column(name)
