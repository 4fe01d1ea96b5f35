"""How often the console lets anyone try a password: per email and per client address.

Counted in this replica's memory (the `limits` library's moving window), every attempt before
its password is hashed, so a guesser pays nothing to us after the limit and learns nothing.
"""

from __future__ import annotations

import math
import time

from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from app.console.client_address import SHARED

Counted = tuple[RateLimitItem, str, str]
"""A limit, what it counts ('address' or 'email') and whose."""


class SignInLimit:
    def __init__(self, per_email: str, per_address: str, shared: str = "300/minute") -> None:
        """`shared`: the ceiling of the attempts whose address cannot be known (SHARED), all
        together: sized to the hashing a replica can afford, not to one browser."""
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._per_email = parse_many(per_email)
        self._per_address = parse_many(per_address)
        self._shared = parse_many(shared)

    def attempt(self, *, email: str | None, address: str) -> int | None:
        """Count one attempt; None when allowed, else the seconds until one is allowed again.

        The address is counted first: an attempt its address may not make is not counted
        against the email, so one address guessing at many accounts cannot lock their owners
        out."""
        per_address = self._shared if address == SHARED else self._per_address
        refused = self._hit([(limit, "address", address) for limit in per_address])
        if not refused and email is not None:
            who = email.strip().lower()
            refused = self._hit([(limit, "email", who) for limit in self._per_email])
        if not refused:
            return None
        return max(self._wait_s(limit, kind, who) for limit, kind, who in refused)

    def _hit(self, counted: list[Counted]) -> list[Counted]:
        """Count each; the ones that refused (a refused hit is not recorded)."""
        return [
            (limit, kind, who)
            for limit, kind, who in counted
            if not self._limiter.hit(limit, "sign-in", kind, who)
        ]

    def _wait_s(self, limit: RateLimitItem, kind: str, who: str) -> int:
        reset_at = self._limiter.get_window_stats(limit, "sign-in", kind, who).reset_time
        return max(1, math.ceil(reset_at - time.time()))
