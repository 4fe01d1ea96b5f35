"""The vocabulary of the plans' counters: a request's windows, what it asks, what admission saw.

`Counters` is the interface (`app.limits.counters` says how the counting works);
`reservation` is the one rule of how much a reply may hold, the same in memory and in Redis.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from limits import RateLimitItem

LEASE_TTL_S = 15.0

Lease = tuple[str, str]
"""(the slot set's key, the lease id): one running request's slot."""


@dataclass(frozen=True, slots=True)
class Budget:
    """A token window beside the minute's and the day's (a monthly budget): reserved and
    settled with them."""

    key: str
    limit: int
    expiry_s: int


@dataclass(frozen=True, slots=True)
class CounterKeys:
    """The windows of one user on one model type (or of one key on every type), and their keys
    (`limits`' naming)."""

    requests: RateLimitItem
    tokens: RateLimitItem
    daily: RateLimitItem
    ids: tuple[str, str]
    day: str
    budgets: tuple[Budget, ...] = ()

    def requests_key(self) -> str:
        return self.requests.key_for(*self.ids, "requests")

    def tokens_key(self) -> str:
        return self.tokens.key_for(*self.ids, "tokens")

    def daily_key(self) -> str:
        return self.daily.key_for(*self.ids, self.day)

    def concurrency_key(self) -> str:
        return f"concurrent/{'/'.join(self.ids)}"


@dataclass(frozen=True, slots=True)
class Ask:
    """What a request asks of its plan on one model type, beyond the keys' own limits."""

    concurrent_requests: int
    reply_tokens: int | None
    """The most its reply may generate, all choices (None: what the windows have left)."""
    choices: int = 1
    longest: int | None = None
    """The most one choice can generate (the model's context); None: unbounded."""

    @property
    def needs(self) -> int:
        """Tokens that must be left to admit it: its reply's most, or a token per choice."""
        return self.reply_tokens if self.reply_tokens is not None else self.choices


def reservation(
    keys: CounterKeys,
    ask: Ask,
    requests: int,
    in_flight: int,
    tokens: int,
    daily_tokens: int,
    budgets_used: tuple[int, ...] = (),
) -> int:
    """The completion tokens admission reserves for a request seen with these counts (its own
    request and slot counted), 0 when a limit refuses it. `RESERVE` is this function in Lua;
    `app.limits.admission` words the refusal."""
    left = min(
        max(0, keys.tokens.amount - tokens),
        max(0, keys.daily.amount - daily_tokens),
        *(max(0, budget.limit - used) for budget, used in zip(keys.budgets, budgets_used)),
    )
    if requests > keys.requests.amount or in_flight > ask.concurrent_requests or ask.needs > left:
        return 0
    if ask.reply_tokens is not None:
        return ask.reply_tokens
    each = left // ask.choices
    if ask.longest is not None:
        each = min(each, ask.longest)
    return each * ask.choices


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The counters as admission saw them, the request counted and its slot taken but before
    its reservation; resets are Unix times."""

    requests: int
    requests_reset: float
    tokens: int
    tokens_reset: float
    daily_tokens: int
    in_flight: int
    reserved: int
    """Completion tokens reserved for the request in every token window (0: refused)."""
    budgets_used: tuple[int, ...] = ()
    """Tokens used (and held) in each of the keys' budgets, as seen."""


class Counters(Protocol):
    """The plans' counters and slots, the same operations in memory and in Redis."""

    async def admit(self, keys: CounterKeys, lease: str, ask: Ask) -> Snapshot:
        """Count the request, hold its slot (`lease`), read the token windows and reserve its
        reply in them (`reservation`), all in one step; a refused request keeps no slot."""

    async def settle(
        self, keys: CounterKeys, lease: str, reserved: int, tokens: int, same_window: bool
    ) -> None:
        """Replace a reservation by the tokens the reply used (past the limit too) and free
        its slot. `same_window`: the minute's window the reservation went to is still open
        (else the tokens go to the window of the moment, the reservation having gone)."""

    async def count_request(self, keys: CounterKeys, requests: int = 1) -> None:
        """Count requests refused before admission (invalid bodies) in their window."""

    async def seed(self, key: str, tokens: int, expiry_s: int) -> None:
        """Start a budget's window at `tokens` (what the key store says was used), unless it
        is already counting."""

    async def requests_used(self, keys: CounterKeys) -> int:
        """Requests counted in the current minute, read without counting."""

    async def release(self, key: str, lease: str) -> None:
        """Give a slot back (again is fine)."""

    async def renew(self, leases: Iterable[Lease]) -> None:
        """Push the expiry of live leases forward (a released or lapsed one stays gone)."""

    async def in_flight(self, key: str) -> int:
        """Live leases of a slot set."""

    async def clear(self) -> None:
        """Forget every counter (tests)."""

    async def close(self) -> None: ...
