"""Each reply's usage, appended to a file on this machine before the batched database write, so
that an ingress replica that dies (kill -9, the OOM killer) loses none of the usage it served.

A replica writes its own file (`<pid>-<random>.jsonl`, one JSON line per reply, one `write`
each, no buffer of its own: what a killed process wrote is in the kernel's page cache and stays)
and holds an exclusive `flock` on it while it lives. When it writes its counts to the database
it starts a new file and deletes the old one once the write has committed. A file whose lock can
be taken has lost its writer: the next replica that starts on the machine (Serve's replacement,
or any other ingress replica of the same key store) claims it, adds its lines to its own counts
and deletes it after its next write. So a crash loses at most the replies that had not ended;
a reply counted twice needs a crash between a write's commit and the unlink that follows it.

Files live in a folder per key store (its URL's hash): two services on one machine never replay
each other's usage.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
import uuid
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from app.accounts.keystore.usage import UsageCount, UsageKey

logger = logging.getLogger("ray.serve.serviceai")

SUFFIX = ".jsonl"


def default_folder(database_url: str) -> Path:
    """The journal folder of the key store at `database_url` on this machine."""
    digest = hashlib.sha256(database_url.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "serviceai-usage" / digest


@dataclass
class _File:
    path: Path
    fd: int


class UsageJournal:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._folder = folder
        self._current = self._open_new()

    def _open_new(self) -> _File:
        path = self._folder / f"{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return _File(path, fd)

    def append(self, key: UsageKey, count: UsageCount) -> None:
        line = json.dumps(
            [
                key.key_id,
                key.model_type,
                key.day.isoformat(),
                count.requests,
                count.prompt_tokens,
                count.completion_tokens,
            ]
        )
        os.write(self._current.fd, f"{line}\n".encode())

    def seal(self) -> list[_File]:
        """Start a new file; the old one (still locked) goes once its counts are written."""
        sealed, self._current = self._current, self._open_new()
        return [sealed]

    def claim_orphans(self) -> tuple[dict[UsageKey, UsageCount], list[_File]]:
        """The counts of the files whose writer died, and those files (locked by this
        replica now, to delete once the counts are written)."""
        counts: dict[UsageKey, UsageCount] = {}
        claimed: list[_File] = []
        for path in sorted(self._folder.glob(f"*{SUFFIX}")):
            if path == self._current.path:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # another replica claimed and wrote it meanwhile
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its writer (or a claimer) lives
                os.close(fd)
                continue
            if not path.exists():  # written and deleted by a claimer before the lock was ours
                os.close(fd)
                continue
            with open(fd, closefd=False) as lines:
                for line in lines:
                    _add(counts, line)
            claimed.append(_File(path, fd))
        if claimed:
            logger.info(
                "Usage of %d ended replica(s) found on this machine; writing it", len(claimed)
            )
        return counts, claimed

    @staticmethod
    def done(files: list[_File]) -> None:
        """Their counts are in the database: delete them."""
        for file in files:
            file.path.unlink(missing_ok=True)
            os.close(file.fd)

    def close(self) -> None:
        """At a clean stop, after the last write: nothing of this file is left to replay."""
        self.done([self._current])


def _add(counts: dict[UsageKey, UsageCount], line: str) -> None:
    try:
        key_id, model_type, day, requests, prompt, completion = json.loads(line)
        key = UsageKey(key_id, model_type, date.fromisoformat(day))
    except (ValueError, TypeError):  # a line cut by the kill: that reply was not whole
        return
    counts.setdefault(key, UsageCount()).add(UsageCount(requests, prompt, completion))
