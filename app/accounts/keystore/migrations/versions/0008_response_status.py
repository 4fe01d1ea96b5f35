"""A stored response's status, apart from its body: a background response is stored queued,
then in progress, then finished (or cancelled, or failed), each step one conditional UPDATE.
Every response stored before was finished: `completed` (the body says `incomplete` where its
reply was cut, which reads the same as before).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("stored_responses") as responses:
        responses.add_column(
            sa.Column("status", sa.String(16), nullable=False, server_default="completed")
        )


def downgrade() -> None:
    with op.batch_alter_table("stored_responses") as responses:
        responses.drop_column("status")
