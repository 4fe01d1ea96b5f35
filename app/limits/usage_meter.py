"""Counts each reply's usage in memory and writes it to the key store in batches.

No database write on the request path: counts per (key, model type, UTC day) add up in a dict
and go out in one statement every `flush_every_s`, and once more when the replica stops. With a
journal (`app.limits.usage_journal`) each reply is also appended to a file on the machine first,
so a replica killed between two writes loses nothing it served: the next one replays the file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, date, datetime

from app.accounts.keystore import KeyStore
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.usage import UsageCount, UsageKey
from app.limits.usage_journal import UsageJournal
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
        journal: UsageJournal | None = None,
    ) -> None:
        self.store = store
        self._today = today
        self._pending: dict[UsageKey, UsageCount] = {}
        self._journal = journal
        self._sealed: list = []  # journal files whose counts are in _pending, not yet written
        self._flusher = PeriodicFlush(self.flush, flush_every_s, "usage")

    def record(
        self, key_id: str, model_type: str, prompt_tokens: int, completion_tokens: int
    ) -> None:
        """One reply's usage (a request, with the tokens the engine reported)."""
        key = UsageKey(key_id, model_type, self._today())
        count = UsageCount(1, prompt_tokens, completion_tokens)
        if self._journal is not None:
            self._journal.append(key, count)
        self._pending.setdefault(key, UsageCount()).add(count)

    def start(self) -> None:
        """Take over the usage that ended replicas left on this machine, then write on the
        timer (at once, if there was any)."""
        if self._journal is not None:
            self._claim_orphans()
        self._flusher.start(now=bool(self._sealed))

    def _claim_orphans(self) -> None:
        assert self._journal is not None
        counts, files = self._journal.claim_orphans()
        for key, count in counts.items():
            self._pending.setdefault(key, UsageCount()).add(count)
        self._sealed += files

    async def flush(self) -> None:
        if self._journal is not None:
            self._sealed += self._journal.seal()
        pending, self._pending = self._pending, {}
        sealed, self._sealed = self._sealed, []
        try:
            if pending:
                await self.store.record_usage(pending)
        except KeyStoreError:
            # Keep the counts (and their files) for the next round, added to what came in.
            logger.warning("Usage not written (key store unavailable); retrying next round")
            for key, count in pending.items():
                self._pending.setdefault(key, UsageCount()).add(count)
            self._sealed = sealed + self._sealed
            return
        if self._journal is not None:
            self._journal.done(sealed)

    async def close(self) -> None:
        await self._flusher.stop()
        if self._journal is not None and not self._pending:
            self._journal.close()
