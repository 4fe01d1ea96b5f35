"""Managing keys is a permission of its own: a key may create, change, rotate and revoke its
user's keys through the account API only when it has it. An existing key with no scope keeps
the power it had; an existing scoped key (a model list, an expiry, limits or a budget) loses it,
so that a narrow key handed to a CI job can no longer mint or revoke its siblings.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCOPE_COLUMNS = (
    "models",
    "expires_at",
    "requests_per_minute",
    "tokens_per_minute",
    "concurrent_requests",
    "tokens_per_day",
    "monthly_tokens",
)


def upgrade() -> None:
    # A plain ADD COLUMN on every database: a batch's copy of the table would trip SQLite's
    # foreign keys from daily_usage.
    op.add_column(
        "api_keys", sa.Column("manage_keys", sa.Boolean(), nullable=False, server_default=sa.true())
    )
    api_keys = sa.table(
        "api_keys", sa.column("manage_keys", sa.Boolean()), *map(sa.column, SCOPE_COLUMNS)
    )
    scoped = sa.or_(*(api_keys.c[name].is_not(None) for name in SCOPE_COLUMNS))
    op.execute(api_keys.update().where(scoped).values(manage_keys=False))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as keys:
        keys.drop_column("manage_keys")
