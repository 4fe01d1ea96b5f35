"""Counts each reply's usage in memory and writes it to the key store in batches.

No database write on the request path: counts per (key, model type, UTC day) add up in a dict
and go out in one statement every `flush_every_s`, and once more when the replica stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, date, datetime

from app.accounts.keystore import KeyStore
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.usage import UsageCount, UsageKey
from app.periodic import PeriodicFlush

logger = logging.getLogger("ray.serve.serviceai")


def utc_today() -> date:
    return datetime.now(UTC).date()


class UsageMeter:
    def __init__(
        self,
        store: KeyStore,
        *,
        flush_every_s: float = 15.0,
        today: Callable[[], date] = utc_today,
    ) -> None:
        self.store = store
        self._today = today
        self._pending: dict[UsageKey, UsageCount] = {}
        self._flusher = PeriodicFlush(self.flush, flush_every_s, "usage")

    def record(
        self, key_id: str, model_type: str, prompt_tokens: int, completion_tokens: int
    ) -> None:
        """One reply's usage (a request, with the tokens the engine reported)."""
        key = UsageKey(key_id, model_type, self._today())
        self._pending.setdefault(key, UsageCount()).add(
            UsageCount(1, prompt_tokens, completion_tokens)
        )

    def start(self) -> None:
        self._flusher.start()

    async def flush(self) -> None:
        pending, self._pending = self._pending, {}
        if not pending:
            return
        try:
            await self.store.record_usage(pending)
        except KeyStoreError:
            # Keep the counts for the next round, added to what came in meanwhile.
            logger.warning("Usage not written (key store unavailable); retrying next round")
            for key, count in pending.items():
                self._pending.setdefault(key, UsageCount()).add(count)

    async def close(self) -> None:
        await self._flusher.stop()
