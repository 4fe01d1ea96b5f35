"""The key store's LoRA adapters: those an operator registers on a model type while the
service runs (the CLI, the admin API), which each ingress reads (app.serving.adapters)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.accounts.keystore import audit
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.database import Database
from app.accounts.keystore.errors import AdapterExists, AdapterNotFound
from app.accounts.keystore.rows import now
from app.accounts.keystore.schemas import Adapter, unix
from app.accounts.keystore.tables import AdapterRow


def adapter_of(row: AdapterRow) -> Adapter:
    return Adapter(
        id=f"{row.model_type}:{row.name}",
        model=row.model_type,
        name=row.name,
        path=row.path,
        created_at=unix(row.created_at) or 0,
    )


class AdapterRecords:
    """Registered LoRA adapters, in the store's database."""

    database: Database

    async def register_adapter(
        self, model_type: str, name: str, path: str, *, actor: Actor | None = None
    ) -> Adapter:
        """A new adapter of `model_type`; 409 where the type has one of that name already."""
        row = AdapterRow(model_type=model_type, name=name, path=path, created_at=now())
        try:
            async with self.database.transaction() as session:
                session.add(row)
                await session.flush()  # a taken name fails here, before the audit entry
                audit.record(session, actor, "adapter.register", f"{model_type}:{name}", path)
        except IntegrityError:
            raise AdapterExists(
                f"{model_type} has an adapter named '{name}' already: remove it first to "
                "register another path under its name.",
                param="name",
            ) from None
        return adapter_of(row)

    async def adapters(self, model_type: str | None = None) -> list[Adapter]:
        """The registered adapters (of one type), by type then name."""
        query = select(AdapterRow).order_by(AdapterRow.model_type, AdapterRow.name)
        if model_type is not None:
            query = query.where(AdapterRow.model_type == model_type)
        async with self.database.transaction() as session:
            return [adapter_of(row) for row in await session.scalars(query)]

    async def remove_adapter(
        self, model_type: str, name: str, *, actor: Actor | None = None
    ) -> Adapter:
        """Unregister an adapter: clients get a 404 for it once each ingress has read the
        store again (within its cache's lifetime)."""
        async with self.database.transaction() as session:
            row = await session.get(AdapterRow, (model_type, name))
            if row is None:
                raise AdapterNotFound(
                    f"{model_type[:64]} has no registered adapter named '{name[:64]}'.",
                    param="name",
                )
            await session.delete(row)
            audit.record(session, actor, "adapter.remove", f"{model_type}:{name}", row.path)
        return adapter_of(row)
