"""Per-plan rate limits: checked and reserved before dispatch, settled with the engine's real
usage after.

Counters are `limits` fixed windows, per user and model type, in process memory (one ingress
replica) or in Redis (shared by every replica). Admission checks them and reserves the most
the reply may generate in one step that no other request can interleave with
(`app.limits.counters`), so requests admitted side by side never generate together more than
the plan has room for. After the reply its real tokens, prompt included, replace the
reservation, off the response path. Prompts are charged when the engine has counted them: a
key can pass a token window by at most the prompts of the requests it has running at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from limits import RateLimitItemPerDay, RateLimitItemPerMinute

from app.accounts.auth import Caller
from app.limits.counters import Ask, CounterKeys, Counters
from app.limits.plans import ModelTypeLimits, Plan, Plans
from app.limits.slots import LeaseKeeper
from app.observability.metrics import rate_limited
from app.openai.errors import ApiError

logger = logging.getLogger("ray.serve.serviceai")

RATE_LIMITED = "rate_limit_exceeded"
QUOTA_SPENT = "insufficient_quota"
STORAGE_RETRY_AFTER_S = 2
FAILURE_LOG_EVERY_S = 30.0


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


class Admission:
    """A request let through: the headers it carries, the longest reply its plan has room
    for, and the charge and release after it."""

    def __init__(
        self,
        limits: RateLimits | None,
        keys: CounterKeys | None,
        headers: dict[str, str],
        *,
        lease: str = "",
        reply_cap: int | None = None,
        reserved: int = 0,
        window_ends: float = 0.0,
    ) -> None:
        self._limits = limits
        self._keys = keys
        self.headers = headers
        self._lease = lease
        self.reply_cap = reply_cap
        self.reserved = reserved
        """Completion tokens held for the reply in the minute's and the day's windows."""
        self._window_ends = window_ends
        self._settled = False

    def reply_length(self, context: int) -> int | None:
        """The longest reply each choice may have when the request sets no limit of its own:
        what the plan has left this minute and today, divided among the choices, and never
        past the model's context (vLLM takes the smaller of it and the room the prompt left).
        None when no plan limits it."""
        return None if self.reply_cap is None else min(self.reply_cap, context)

    def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Replace the reservation by the tokens the engine reported and free the concurrency
        slot (once)."""
        if self._settled or self._limits is None or self._keys is None:
            return
        self._settled = True
        limits = self._limits
        limits.leases.drop(self._lease)
        tokens = prompt_tokens + completion_tokens
        same_window = time.time() < self._window_ends
        limits.in_background(limits.counters.settle(
            self._keys, self._lease, self.reserved, tokens, same_window
        ))


UNLIMITED = Admission(None, None, {})
"""What a request gets when the limiter's storage is down and the service fails open."""


class RateLimits:
    """The plans and their counters; kept in `app.state.limits`."""

    def __init__(self, plans: Plans, counters: Counters, *, fail_open: bool = True) -> None:
        self.plans = plans
        self.counters = counters
        self.leases = LeaseKeeper(counters)
        self.fail_open = fail_open
        self._background: set[asyncio.Task[None]] = set()
        self._last_failure_log = -math.inf

    def plan_limits(self, plan: str) -> Plan:
        """The limits of a plan by model type (what a console shows); 403 for an unknown plan."""
        found = self.plans.get(plan)
        if found is None:
            logger.error("A user's plan %r is not configured; plans: %s", plan, self.plans.names)
            raise ApiError(
                403,
                f"Your account's plan '{plan}' is not offered by this service "
                f"(plans: {', '.join(self.plans.names)}). Contact support to change your plan.",
                type="invalid_request_error",
                code="unknown_plan",
            )
        return found

    def _keys(self, caller: Caller, model_type: str, limits: ModelTypeLimits) -> CounterKeys:
        return CounterKeys(
            requests=RateLimitItemPerMinute(limits.requests_per_minute),
            tokens=RateLimitItemPerMinute(limits.tokens_per_minute),
            daily=RateLimitItemPerDay(limits.tokens_per_day),
            ids=(caller.user_id, model_type),
            day=datetime.now(UTC).date().isoformat(),
        )

    def check_fits(
        self, caller: Caller, model_type: str, max_tokens: int | None, param: str = "max_tokens"
    ) -> None:
        """Refuse a reply that can never fit the plan, before any counter is touched.

        `max_tokens` (the request's `param`, times its choices) above the plan's whole
        per-minute or per-day token limit is a 429 that no wait cures: `x-should-retry:
        false`, no Retry-After.
        """
        if max_tokens is None:
            return
        limits = self.plan_limits(caller.plan).on(model_type)
        for name, limit in (
            ("tokens_per_minute", limits.tokens_per_minute),
            ("tokens_per_day", limits.tokens_per_day),
        ):
            if max_tokens > limit:
                rate_limited(name, caller.plan, model_type)
                raise ApiError(
                    429,
                    f"Request too large for {model_type}: the reply may take {max_tokens} "
                    f"tokens ({param}, all choices), more than your plan's whole "
                    f"{name.replace('_', ' ')} ({limit}). Lower {param} or upgrade your plan.",
                    type="tokens",
                    param=param,
                    code=RATE_LIMITED,
                    headers={"x-should-retry": "false"},
                )

    async def admit(
        self,
        caller: Caller,
        model_type: str,
        max_tokens: int | None,
        *,
        choices: int = 1,
        longest: int | None = None,
    ) -> Admission:
        """Count the request, take a concurrency slot and reserve its reply, or refuse it
        with a 429.

        `max_tokens` (the most completion tokens the reply may take, all choices together)
        above what is left of the token budget or the daily quota is refused up front, and
        reserved otherwise; without it the reply is capped at what is left, each choice at
        `longest` (the context), and that cap is reserved (`Admission.reply_length`).
        Requests running at once never hold more than the windows have left.
        """
        limits = self.plan_limits(caller.plan).on(model_type)
        keys = self._keys(caller, model_type, limits)
        ask = Ask(limits.concurrent_requests, max_tokens, choices, longest)
        lease = uuid.uuid4().hex
        try:
            seen = await self.counters.admit(keys, lease, ask)
        except Exception as exc:  # any storage failure: Redis down, timeout, protocol error
            return self._storage_failed(exc)
        now = time.time()
        request_window = Window(limits.requests_per_minute, seen.requests, seen.requests_reset)
        token_window = Window(limits.tokens_per_minute, seen.tokens, seen.tokens_reset)
        daily_window = Window(limits.tokens_per_day, seen.daily_tokens, _next_midnight(now))
        if not seen.reserved:
            limit, error = _refusal(
                model_type, limits, request_window, token_window, daily_window, seen.in_flight,
                ask, now,
            )
            rate_limited(limit, caller.plan, model_type)
            error.headers.update(rate_limit_headers(request_window, token_window, now))
            raise error
        self.leases.hold(keys.concurrency_key(), lease)
        held = Window(token_window.limit, token_window.used + seen.reserved, seen.tokens_reset)
        headers = rate_limit_headers(request_window, held, now)
        return Admission(
            self, keys, headers, lease=lease, reply_cap=seen.reserved // choices,
            reserved=seen.reserved, window_ends=seen.tokens_reset,
        )

    async def has_requests_left(self, caller: Caller, model_type: str) -> bool:
        """Whether the caller's request window on `model_type` has room, read without
        counting anything; True where the storage cannot say (admission decides then)."""
        limits = self.plan_limits(caller.plan).on(model_type)
        try:
            used = await self.counters.requests_used(self._keys(caller, model_type, limits))
        except Exception:
            return True
        return used < limits.requests_per_minute

    def count_refused(self, caller: Caller, model: object) -> None:
        """Count a request refused for its body against the caller's request rate: on the
        model type it named, or on every type of its plan when it named none of them."""
        plan = self.plans.get(caller.plan)
        if plan is None:
            return
        types = [model] if isinstance(model, str) and model in plan.root else list(plan.root)
        for model_type in types:
            keys = self._keys(caller, model_type, plan.on(model_type))
            self.in_background(self.counters.count_request(keys))

    def _storage_failed(self, exc: Exception) -> Admission:
        now = time.monotonic()
        if now - self._last_failure_log >= FAILURE_LOG_EVERY_S:
            self._last_failure_log = now
            action = "serving without limits" if self.fail_open else "refusing requests (503)"
            logger.warning("Rate-limit storage unreachable (%s): %s", type(exc).__name__, action)
        if self.fail_open:
            return UNLIMITED
        raise ApiError(
            503,
            "Rate limits cannot be checked right now, so the request was not served. "
            f"Retry in {STORAGE_RETRY_AFTER_S} s.",
            type="server_error",
            code="rate_limiter_unavailable",
            headers={"Retry-After": str(STORAGE_RETRY_AFTER_S)},
        )

    def in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run storage writes off the response path; keep a reference until they finish."""
        task = asyncio.get_running_loop().create_task(self._logged(work))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _logged(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception as exc:
            logger.warning("Rate-limit storage write failed: %s", type(exc).__name__)

    async def written(self) -> None:
        """Wait for the writes still running (charges of the last replies, refused bodies)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def close(self) -> None:
        """Stop renewing leases; wait for the writes still running."""
        await self.leases.close()
        await self.written()


def rate_limit_headers(requests: Window, tokens: Window, now: float) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": str(requests.limit),
        "x-ratelimit-remaining-requests": str(requests.remaining),
        "x-ratelimit-reset-requests": duration(requests.resets_in(now)),
        "x-ratelimit-limit-tokens": str(tokens.limit),
        "x-ratelimit-remaining-tokens": str(tokens.remaining),
        "x-ratelimit-reset-tokens": duration(tokens.resets_in(now)),
    }


def _next_midnight(now: float) -> float:
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


def _refusal(
    model_type: str,
    limits: ModelTypeLimits,
    requests: Window,
    tokens: Window,
    daily: Window,
    in_flight: int,
    ask: Ask,
    now: float,
) -> tuple[str, ApiError]:
    """The limit a request that `counters.reservation` refused hit, and its 429: quota first
    (no retry helps), then the rates. The limit's name is the `limit` label of
    serviceai_rate_limited. The windows count the reservations of running requests."""
    max_tokens = ask.reply_tokens
    if daily.remaining <= 0 or ask.needs > daily.remaining:
        asked = "" if daily.remaining <= 0 else f" The reply may take {ask.needs} (max_tokens)."
        return "tokens_per_day", ApiError(
            429,
            f"You exceeded your daily token quota for {model_type}: {daily.remaining} of "
            f"{limits.tokens_per_day} tokens left today (UTC).{asked} The quota resets at "
            "00:00 UTC. Upgrade your plan for a larger quota.",
            type="insufficient_quota",
            code=QUOTA_SPENT,
            headers={"x-should-retry": "false"},
        )
    if requests.used > requests.limit:
        return "requests_per_minute", _too_many(
            "requests",
            f"Rate limit reached for {model_type} on requests per minute: limit "
            f"{requests.limit}.",
            requests.resets_in(now),
        )
    if in_flight > limits.concurrent_requests:
        return "concurrent_requests", _too_many(
            "requests",
            f"Rate limit reached for {model_type} on concurrent requests: limit "
            f"{limits.concurrent_requests} at once. Wait for one to finish.",
            1,
        )
    if tokens.remaining <= 0 or max_tokens is None:
        return "tokens_per_minute", _too_many(
            "tokens",
            f"Rate limit reached for {model_type} on tokens per minute: limit {tokens.limit}, "
            f"used or held by running requests {tokens.used}.",
            tokens.resets_in(now),
        )
    return "tokens_per_minute", _too_many(
        "tokens",
        f"Rate limit reached for {model_type} on tokens per minute: the reply may take "
        f"{max_tokens} tokens (max_tokens), more than the {tokens.remaining} of "
        f"{tokens.limit} left this minute (running requests hold what their replies may "
        "take); lower max_tokens, or wait.",
        tokens.resets_in(now),
    )
