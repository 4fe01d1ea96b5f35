"""The key store: users and their API keys (hashed), in SQLite or PostgreSQL."""

from __future__ import annotations

from app.accounts.keystore.database import Database
from app.accounts.keystore.store import KeyOwner, KeyStore
from app.config.settings import Settings

__all__ = ["Database", "KeyOwner", "KeyStore", "open_store"]


async def open_store(settings: Settings) -> KeyStore:
    """Connect to the configured database, upgrading its schema first."""
    database = await Database.open(settings.database_url.get_secret_value())
    return KeyStore(database, max_keys_per_user=settings.max_keys_per_user)
