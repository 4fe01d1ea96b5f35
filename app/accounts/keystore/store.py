"""The key store: users, their keys, and their usage, one module per aggregate behind one class.

`KeyStore` is what the service holds (`app.accounts.keystore.open_store`): the operations of
users (`user_records`), API keys and the lookup behind every request (`key_records`), usage
and budgets (`usage_records`), and the operators' audit log, on one database.
"""

from __future__ import annotations

from sqlalchemy import func, select

from app.accounts.keystore import audit
from app.accounts.keystore.adapter_records import AdapterRecords
from app.accounts.keystore.database import Database
from app.accounts.keystore.key_records import KeyOwner, KeyRecords
from app.accounts.keystore.schemas import AuditPage
from app.accounts.keystore.tables import UserRow
from app.accounts.keystore.usage_records import UsageRecords
from app.accounts.keystore.user_records import UserRecords

__all__ = ["KeyOwner", "KeyStore"]


class KeyStore(UserRecords, KeyRecords, UsageRecords, AdapterRecords):
    def __init__(self, database: Database, *, max_keys_per_user: int = 50) -> None:
        self.database = database
        self.max_keys_per_user = max_keys_per_user

    async def audit_log(self, limit: int = 50, before: int | None = None) -> AuditPage:
        """Operator actions, newest first; `before` an entry's id for the page after it."""
        async with self.database.transaction() as session:
            rows = list(await session.scalars(audit.page_query(limit, before)))
        return audit.page_of(rows, limit)

    async def users_per_plan(self) -> dict[str, int]:
        """How many users each plan name in the store has (disabled users included)."""
        query = select(UserRow.plan, func.count()).group_by(UserRow.plan)
        async with self.database.connection() as connection:
            return {plan: count for plan, count in (await connection.execute(query)).all()}
