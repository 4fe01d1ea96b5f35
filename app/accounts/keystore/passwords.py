"""Account passwords for the console: argon2id hashes (argon2-cffi), never the password itself.

Unlike API keys, passwords are chosen by people and guessable, so they get a slow, salted,
memory-hard hash. Hashing takes tens of milliseconds of CPU: callers run it off the event loop.
"""

from __future__ import annotations

import asyncio
import secrets
from functools import lru_cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

MIN_LENGTH = 10
MAX_LENGTH = 1024
# RFC 9106's second recommended profile (argon2id, 64 MiB, 3 passes): argon2-cffi's default.
_hasher = PasswordHasher()


async def hash_password(password: str) -> str:
    return await asyncio.to_thread(_hasher.hash, password)


async def verify(stored_hash: str | None, password: str) -> bool:
    """Whether `password` matches; with no stored hash it still costs one hash, like a miss."""
    try:
        matched = await asyncio.to_thread(_hasher.verify, stored_hash or _absent_hash(), password)
    except (VerificationError, InvalidHashError):
        return False
    return matched and stored_hash is not None


def needs_rehash(stored_hash: str) -> bool:
    """True once the hash was made with weaker parameters than today's."""
    return _hasher.check_needs_rehash(stored_hash)


@lru_cache(maxsize=1)
def _absent_hash() -> str:
    # Checked against for unknown emails, so that a miss takes as long as a wrong password.
    return _hasher.hash(secrets.token_urlsafe(16))
