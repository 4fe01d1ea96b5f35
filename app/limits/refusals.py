"""The 429s of the rate limits: their wording, their headers and when each window starts over.

Every refusal names the limit it hit, what is left of it and when it resets, with OpenAI's
`x-ratelimit-*` headers and a Retry-After where a wait cures it (`x-should-retry: false`
where none does). Admission (`app.limits.admission`) decides; this module only words it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

from app.limits.counters import Ask, CounterKeys, Snapshot
from app.openai.errors import ApiError

RATE_LIMITED = "rate_limit_exceeded"
QUOTA_SPENT = "insufficient_quota"


def duration(seconds: float) -> str:
    """OpenAI's reset format: '0s', '20s', '6m0s', '1h2m3s' (whole seconds, rounded up)."""
    total = max(0, math.ceil(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@dataclass(frozen=True, slots=True)
class Window:
    """One counter as admission saw it: its limit, what is left and when it starts over."""

    limit: int
    used: int
    resets_at: float

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    def resets_in(self, now: float) -> float:
        return max(0.0, self.resets_at - now)


def rate_limit_headers(requests: Window, tokens: Window, now: float) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": str(requests.limit),
        "x-ratelimit-remaining-requests": str(requests.remaining),
        "x-ratelimit-reset-requests": duration(requests.resets_in(now)),
        "x-ratelimit-limit-tokens": str(tokens.limit),
        "x-ratelimit-remaining-tokens": str(tokens.remaining),
        "x-ratelimit-reset-tokens": duration(tokens.resets_in(now)),
    }


def next_midnight(now: float) -> float:
    today = datetime.fromtimestamp(now, UTC).date()
    return datetime(today.year, today.month, today.day, tzinfo=UTC).timestamp() + 86400


def _retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def _too_many(kind: str, message: str, retry_in: float) -> ApiError:
    return ApiError(
        429,
        f"{message} Retry in {_retry_after(retry_in)} s.",
        type=kind,
        code=RATE_LIMITED,
        headers={"Retry-After": _retry_after(retry_in)},
    )


def too_large(
    model_type: str, whose: str, name: str, limit: int, max_tokens: int, param: str
) -> ApiError:
    """The 429 of a reply larger than a whole limit: no wait cures it; a monthly budget's is
    the 429 of a spent budget, as admission's."""
    asked = f"the reply may take {max_tokens} tokens ({param}, all choices)"
    if name == "monthly_tokens":
        return ApiError(
            429,
            f"{whose[0].upper()}{whose[1:]} monthly token budget ({limit} tokens) is smaller "
            f"than this request: {asked}. Lower {param}; an operator can raise the budget.",
            type="insufficient_quota",
            param=param,
            code=QUOTA_SPENT,
            headers={"x-should-retry": "false"},
        )
    return ApiError(
        429,
        f"Request too large for {model_type}: {asked}, more than {whose} whole "
        f"{name.replace('_', ' ')} ({limit}). Lower {param}.",
        type="tokens",
        param=param,
        code=RATE_LIMITED,
        headers={"x-should-retry": "false"},
    )


class Scope(Enum):
    """Whose windows refused a request: the user's plan, or the key's own limits."""

    PLAN = ("", "your plan's ", "your daily token quota", "Upgrade your plan for a larger quota.")
    KEY = (
        "key_",
        "this API key's ",
        "this API key's daily token limit",
        "The key's owner or an operator can raise it.",
    )

    def __init__(self, label: str, whose: str, daily: str, remedy: str) -> None:
        self.label = label
        self.whose = whose
        self.daily = daily
        self.remedy = remedy


def windows_headers(keys: CounterKeys, seen: Snapshot, now: float) -> dict[str, str]:
    """The rate-limit headers of one set of windows as admission left them (a reservation
    counts as used)."""
    requests = Window(keys.requests.amount, seen.requests, seen.requests_reset)
    tokens = Window(keys.tokens.amount, seen.tokens + seen.reserved, seen.tokens_reset)
    return rate_limit_headers(requests, tokens, now)


def refusal(
    model_type: str, scope: Scope, keys: CounterKeys, seen: Snapshot, ask: Ask, now: float
) -> tuple[str, ApiError]:
    """The limit a request that `counters.reservation` refused hit, and its 429 with the
    windows' headers."""
    requests = Window(keys.requests.amount, seen.requests, seen.requests_reset)
    tokens = Window(keys.tokens.amount, seen.tokens, seen.tokens_reset)
    daily = Window(keys.daily.amount, seen.daily_tokens, next_midnight(now))
    budgets = [
        Window(b.limit, used, next_month(now)) for b, used in zip(keys.budgets, seen.budgets_used)
    ]
    limit, error = _refusal(
        model_type, scope, requests, tokens, daily, budgets, seen.in_flight, ask, now
    )
    error.headers.update(rate_limit_headers(requests, tokens, now))
    return limit, error


def _refusal(
    model_type: str,
    scope: Scope,
    requests: Window,
    tokens: Window,
    daily: Window,
    budgets: list[Window],
    in_flight: int,
    ask: Ask,
    now: float,
) -> tuple[str, ApiError]:
    """Budgets and quota first (no retry helps), then the rates. The limit's name is the
    `limit` label of serviceai_rate_limited. The windows count the reservations of running
    requests."""
    max_tokens = ask.reply_tokens
    asked = f" The reply may take {ask.needs} (max_tokens)."
    for budget in budgets:
        if budget.remaining <= 0 or ask.needs > budget.remaining:
            owner = "this API key's" if scope is Scope.KEY else "your account's"
            return f"{scope.label}monthly_tokens", ApiError(
                429,
                f"{owner[0].upper()}{owner[1:]} monthly token budget is spent: "
                f"{budget.remaining} of {budget.limit} tokens left this month (UTC)."
                f"{asked if budget.remaining > 0 else ''} It starts over on the 1st at 00:00 "
                "UTC; an operator can raise it.",
                type="insufficient_quota",
                code=QUOTA_SPENT,
                headers={"x-should-retry": "false"},
            )
    if daily.remaining <= 0 or ask.needs > daily.remaining:
        return f"{scope.label}tokens_per_day", ApiError(
            429,
            f"You exceeded {scope.daily} for {model_type}: {daily.remaining} of "
            f"{daily.limit} tokens left today (UTC).{asked if daily.remaining > 0 else ''} "
            f"The quota resets at 00:00 UTC. {scope.remedy}",
            type="insufficient_quota",
            code=QUOTA_SPENT,
            headers={"x-should-retry": "false"},
        )
    if requests.used > requests.limit:
        return f"{scope.label}requests_per_minute", _too_many(
            "requests",
            f"Rate limit reached for {model_type} on {scope.whose}requests per minute: limit "
            f"{requests.limit}.",
            requests.resets_in(now),
        )
    if in_flight > ask.concurrent_requests:
        return f"{scope.label}concurrent_requests", _too_many(
            "requests",
            f"Rate limit reached for {model_type} on {scope.whose}concurrent requests: limit "
            f"{ask.concurrent_requests} at once. Wait for one to finish.",
            1,
        )
    if tokens.remaining <= 0 or max_tokens is None:
        return f"{scope.label}tokens_per_minute", _too_many(
            "tokens",
            f"Rate limit reached for {model_type} on {scope.whose}tokens per minute: limit "
            f"{tokens.limit}, used or held by running requests {tokens.used}.",
            tokens.resets_in(now),
        )
    return f"{scope.label}tokens_per_minute", _too_many(
        "tokens",
        f"Rate limit reached for {model_type} on {scope.whose}tokens per minute: the reply "
        f"may take {max_tokens} tokens (max_tokens), more than the {tokens.remaining} of "
        f"{tokens.limit} left this minute (running requests hold what their replies may "
        "take); lower max_tokens, or wait.",
        tokens.resets_in(now),
    )


def tighter(first: dict[str, str], second: dict[str, str]) -> dict[str, str]:
    """The rate-limit headers of whichever set of windows has less left, requests and tokens
    each."""
    chosen = dict(first)
    for kind in ("requests", "tokens"):
        remaining = f"x-ratelimit-remaining-{kind}"
        if int(second[remaining]) < int(first[remaining]):
            for part in ("limit", "remaining", "reset"):
                name = f"x-ratelimit-{part}-{kind}"
                chosen[name] = second[name]
    return chosen


def next_month(now: float) -> float:
    today = datetime.fromtimestamp(now, UTC).date()
    year, month = (today.year + 1, 1) if today.month == 12 else (today.year, today.month + 1)
    return datetime(year, month, 1, tzinfo=UTC).timestamp()
