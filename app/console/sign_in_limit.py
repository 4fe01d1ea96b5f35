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


class SignInLimit:
    def __init__(self, per_email: str, per_address: str) -> None:
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._per_email = parse_many(per_email)
        self._per_address = parse_many(per_address)

    def attempt(self, *, email: str | None, address: str) -> int | None:
        """Count one attempt; None when allowed, else the seconds until one is allowed again."""
        counted = [(limit, "address", address) for limit in self._per_address]
        if email is not None:
            counted += [(limit, "email", email.strip().lower()) for limit in self._per_email]
        refused = [
            (limit, kind, who)
            for limit, kind, who in counted
            if not self._limiter.hit(limit, "sign-in", kind, who)
        ]
        if not refused:
            return None
        return max(self._wait_s(limit, kind, who) for limit, kind, who in refused)

    def _wait_s(self, limit: RateLimitItem, kind: str, who: str) -> int:
        reset_at = self._limiter.get_window_stats(limit, "sign-in", kind, who).reset_time
        return max(1, math.ceil(reset_at - time.time()))
