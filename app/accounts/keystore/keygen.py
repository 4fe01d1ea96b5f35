"""API keys as secrets: how they are made, recognised, hashed and shown.

A key is `sai-` and 43 URL-safe characters (256 bits from `secrets`). Keys are this random, so a
plain SHA-256 is a safe one-way form to store and look up; a slow password hash would buy nothing.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "sai-"
KEY_RANDOM_BYTES = 32
_KEY_PATTERN = re.compile(rf"{re.escape(KEY_PREFIX)}[A-Za-z0-9_-]{{43}}")
KEY_SHAPE = f"'{KEY_PREFIX}' followed by 43 letters, digits, '-' or '_'"


@dataclass(frozen=True, slots=True, repr=False)
class IssuedKey:
    """A new key: the secret (shown once, never stored), its hash and its display form."""

    secret: str
    hash: str
    display: str


def issue() -> IssuedKey:
    secret = KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)
    return IssuedKey(secret=secret, hash=hash_key(secret), display=display_form(secret))


def is_well_formed(token: str) -> bool:
    return _KEY_PATTERN.fullmatch(token) is not None


def hash_key(secret: str) -> str:
    """The stored form: SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def display_form(secret: str) -> str:
    """What lists show so a user can tell keys apart: `sai-...wxyz`."""
    return f"{KEY_PREFIX}...{secret[-4:]}"


def new_id(kind: str) -> str:
    """A public, random identifier such as `key_3f9a...` or `user_...` (never secret)."""
    return f"{kind}_{secrets.token_hex(12)}"
