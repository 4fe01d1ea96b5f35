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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from limits import RateLimitItemPerDay, RateLimitItemPerMinute

from app.accounts.auth import Caller
from app.accounts.keystore.schemas import KeyLimits
from app.limits.counters import Ask, Budget, CounterKeys, Counters
from app.limits.plans import ModelTypeLimits, Plan, Plans
from app.limits.refusals import Scope, refusal, tighter, too_large, windows_headers
from app.limits.slots import LeaseKeeper
from app.limits.ticket import Ticket
from app.limits.usage_meter import UsageMeter
from app.limits.writes import CounterWrites
from app.observability.metrics import rate_limited
from app.openai.errors import ApiError
from app.openai.protocol import ReplyLength
from deployments.wire import ModelInfo

logger = logging.getLogger("ray.serve.serviceai")

MonthlyUsage = Callable[[str, str], Awaitable[int]]
"""(kind, id) -> the tokens a user's ("user") or a key's ("key") keys used this UTC month."""
UNBOUNDED = 2**62
"""The limit of a key's window that only its other limits bound."""
MONTH_EXPIRY_S = 32 * 86400
STORAGE_RETRY_AFTER_S = 2
FAILURE_LOG_EVERY_S = 30.0
# The longest a refusal waits for its count to be written (a storage that does not answer).
REFUSED_WRITE_WAIT_S = 1.0


@dataclass(frozen=True, slots=True)
class Hold:
    """What one set of windows holds for a request: its slot and its reservation."""

    keys: CounterKeys
    lease: str
    reserved: int
    window_ends: float
    """When the minute's window the reservation went to ends."""


class Admission:
    """A request let through: the headers it carries, the longest reply its plan (and its
    key's scopes) have room for, and the settlement after it."""

    def __init__(
        self,
        limits: RateLimits | None,
        holds: list[Hold],
        headers: dict[str, str],
        *,
        reply_cap: int | None = None,
    ) -> None:
        self._limits = limits
        self._holds = holds
        self.headers = headers
        self.reply_cap = reply_cap
        self._settled = False

    @property
    def reserved(self) -> int:
        """Completion tokens held for the reply (in every window that limits it)."""
        return min((hold.reserved for hold in self._holds), default=0)

    def reply_length(self, context: int) -> int | None:
        """The longest reply each choice may have when the request sets no limit of its own:
        what the plan has left this minute and today, divided among the choices, and never
        past the model's context (vLLM takes the smaller of it and the room the prompt left).
        None when no plan limits it."""
        return None if self.reply_cap is None else min(self.reply_cap, context)

    def settle(self, prompt_tokens: int, completion_tokens: int) -> asyncio.Future[None]:
        """Replace the reservation by the tokens the engine reported and free the concurrency
        slot (once), off the response path; done when that is written, which the response
        awaits (`app.limits.ticket.settled`) before its last bytes, so that a client that
        waits for a reply before sending the next never meets its own slot still taken."""
        if self._settled or self._limits is None:
            return done()
        self._settled = True
        return self._limits.release(self._holds, prompt_tokens + completion_tokens)


def done() -> asyncio.Future[None]:
    """A write that has nothing to do."""
    nothing = asyncio.get_running_loop().create_future()
    nothing.set_result(None)
    return nothing


UNLIMITED = Admission(None, [], {})
"""What a request gets when the limiter's storage is down and the operator chose to fail open."""


class RateLimits:
    """The plans and their counters; kept in `app.state.limits`."""

    def __init__(
        self,
        plans: Plans,
        counters: Counters,
        *,
        fail_open: bool = False,
        monthly_usage: MonthlyUsage | None = None,
    ) -> None:
        """`monthly_usage`: what the key store says a user's or a key's keys used this month,
        to start a budget's window from (a new replica in memory, a Redis that lost it)."""
        self.plans = plans
        self.counters = counters
        self.leases = LeaseKeeper(counters)
        self.fail_open = fail_open
        self._monthly_usage = monthly_usage
        self._seeded: set[str] = set()
        self.writes = CounterWrites(counters)
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
        """The user's windows on `model_type`, with the user's monthly budget."""
        budget = caller.user_monthly_tokens
        return CounterKeys(
            requests=RateLimitItemPerMinute(limits.requests_per_minute),
            tokens=RateLimitItemPerMinute(limits.tokens_per_minute),
            daily=RateLimitItemPerDay(limits.tokens_per_day),
            ids=(caller.user_id, model_type),
            day=datetime.now(UTC).date().isoformat(),
            budgets=() if budget is None else (_monthly("user", caller.user_id, budget),),
        )

    def _key_keys(self, caller: Caller) -> CounterKeys | None:
        """The key's own windows, on every model type together; None for a key with no
        limits or budget of its own."""
        limits, budget = caller.key_limits, caller.key_monthly_tokens
        if limits is None and budget is None:
            return None
        limits = limits or KeyLimits()
        return CounterKeys(
            requests=RateLimitItemPerMinute(limits.requests_per_minute or UNBOUNDED),
            tokens=RateLimitItemPerMinute(limits.tokens_per_minute or UNBOUNDED),
            daily=RateLimitItemPerDay(limits.tokens_per_day or UNBOUNDED),
            ids=("key", caller.key_id),
            day=datetime.now(UTC).date().isoformat(),
            budgets=() if budget is None else (_monthly("key", caller.key_id, budget),),
        )

    def check_fits(self, caller: Caller, model_type: str, reply: ReplyLength) -> None:
        """Refuse a reply that can never fit the plan, before any counter is touched.

        A reply that may take more (`reply.total`: its field times its choices) than the
        plan's whole per-minute or per-day token limit (or the key's) is a 429 that no wait
        cures: `x-should-retry: false`, no Retry-After. Above a whole monthly budget it is the
        429 of a spent budget (`insufficient_quota`), as on every API.
        """
        max_tokens, param = reply.total, reply.field
        if max_tokens is None:
            return
        limits = self.plan_limits(caller.plan).on(model_type)
        key = caller.key_limits or KeyLimits()
        for label, whose, name, limit in (
            ("key_", "this API key's", "monthly_tokens", caller.key_monthly_tokens),
            ("", "your account's", "monthly_tokens", caller.user_monthly_tokens),
            ("", "your plan's", "tokens_per_minute", limits.tokens_per_minute),
            ("", "your plan's", "tokens_per_day", limits.tokens_per_day),
            ("key_", "this API key's", "tokens_per_minute", key.tokens_per_minute),
            ("key_", "this API key's", "tokens_per_day", key.tokens_per_day),
        ):
            if limit is not None and max_tokens > limit:
                rate_limited(label + name, caller.plan, model_type)
                raise too_large(model_type, whose, name, limit, max_tokens, param)

    async def open(
        self,
        caller: Caller,
        model_type: str,
        reply: ReplyLength,
        *,
        model: ModelInfo,
        usage: UsageMeter | None,
        usage_model: str | None = None,
    ) -> Ticket:
        """Admit a request (`admit`) and hand it its ticket: what it sets in the engine's
        payload and its one charge, to these counters and to `usage` (under `usage_model`, a
        LoRA adapter's name, where it names one: the type's windows are charged all the same)."""
        admission = await self.admit(
            caller, model_type, reply.total, choices=reply.choices, longest=model.max_model_len
        )
        priority = self.plan_limits(caller.plan).priority
        return Ticket(admission, usage, caller.key_id, usage_model or model_type, priority)

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
        key_keys = self._key_keys(caller)
        try:
            await self._seed(keys, key_keys)
            plan_hold, headers = await self._hold(
                keys,
                Ask(limits.concurrent_requests, max_tokens, choices, longest),
                caller,
                model_type,
                Scope.PLAN,
            )
        except ApiError:
            raise
        except Exception as exc:  # any storage failure: Redis down, timeout, protocol error
            return self._storage_failed(exc)
        holds = [plan_hold]
        if key_keys is not None:
            concurrent = (caller.key_limits or KeyLimits()).concurrent_requests or UNBOUNDED
            # The reply the plan's windows hold, or less if the key's windows have less room.
            each = longest if max_tokens is not None else plan_hold.reserved // choices
            try:
                key_hold, key_headers = await self._hold(
                    key_keys,
                    Ask(concurrent, max_tokens, choices, each),
                    caller,
                    model_type,
                    Scope.KEY,
                )
            except BaseException as exc:
                self.release(holds, 0)
                if isinstance(exc, ApiError) or not isinstance(exc, Exception):
                    raise
                return self._storage_failed(exc)
            holds.append(key_hold)
            headers = tighter(headers, key_headers)
        for hold in holds:
            self.leases.hold(hold.keys.concurrency_key(), hold.lease)
        reserved = min(hold.reserved for hold in holds)
        return Admission(self, holds, headers, reply_cap=reserved // choices)

    async def _hold(
        self, keys: CounterKeys, ask: Ask, caller: Caller, model_type: str, scope: Scope
    ) -> tuple[Hold, dict[str, str]]:
        """Reserve in one set of windows, or raise its 429."""
        lease = uuid.uuid4().hex
        seen = await self.counters.admit(keys, lease, ask)
        now = time.time()
        if not seen.reserved:
            limit, error = refusal(model_type, scope, keys, seen, ask, now)
            rate_limited(limit, caller.plan, model_type)
            raise error
        hold = Hold(keys, lease, seen.reserved, seen.tokens_reset)
        return hold, windows_headers(keys, seen, now)

    def release(self, holds: list[Hold], tokens: int) -> asyncio.Future[Any]:
        """Settle each hold with the tokens the reply used (off the response path); done when
        every hold is written (failures are logged, not raised)."""
        now = time.time()
        writes = []
        for hold in holds:
            self.leases.drop(hold.lease)
            writes.append(
                self.writes.start(
                    self.counters.settle(
                        hold.keys, hold.lease, hold.reserved, tokens, now < hold.window_ends
                    )
                )
            )
        return asyncio.gather(*writes) if writes else done()

    async def _seed(self, *keys: CounterKeys | None) -> None:
        """Start each budget's window, once per month and replica, from the key store's
        usage (a Redis window already counting is kept)."""
        if self._monthly_usage is None:
            return
        for budget in (b for k in keys if k is not None for b in k.budgets):
            if budget.key in self._seeded:
                continue
            _, kind, owner, _ = budget.key.split("/")
            try:
                used = await self._monthly_usage(kind, owner)
            except Exception as exc:  # the store is down: the window starts from what it has
                logger.warning("Reading monthly usage failed: %s", type(exc).__name__)
                continue
            await self.counters.seed(budget.key, used, budget.expiry_s)
            self._seeded.add(budget.key)

    async def has_requests_left(self, caller: Caller, model_type: str) -> bool:
        """Whether the caller's request window on `model_type` has room, read without
        counting anything; True where the storage cannot say (admission decides then)."""
        limits = self.plan_limits(caller.plan).on(model_type)
        try:
            used = await self.counters.requests_used(self._keys(caller, model_type, limits))
        except Exception:
            return True
        return used < limits.requests_per_minute

    async def refuse(self, caller: Caller, model: object) -> None:
        """Count a request refused for its body, and wait (at most `REFUSED_WRITE_WAIT_S`)
        until the count is written: the refusal then goes out after it, so the caller's next
        request is admitted against it (a count written off the response path could land
        after that request, on a loaded ingress)."""
        await asyncio.wait([self.count_refused(caller, model)], timeout=REFUSED_WRITE_WAIT_S)

    def count_refused(self, caller: Caller, model: object) -> asyncio.Future[None]:
        """Count a request refused for its body against the caller's request rate: on the
        model type it named, or on every type of its plan when it named none of them. Done
        when the write that takes it along has ended."""
        plan = self.plans.get(caller.plan)
        if plan is None:
            return done()
        types = [model] if isinstance(model, str) and model in plan.root else list(plan.root)
        return self.writes.count_refused(
            [self._keys(caller, model_type, plan.on(model_type)) for model_type in types]
        )

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

    async def written(self) -> None:
        """Wait for the writes still running (charges of the last replies, refused bodies)."""
        await self.writes.written()

    async def close(self) -> None:
        """Stop renewing leases; wait for the writes still running."""
        await self.leases.close()
        await self.written()


def _monthly(kind: str, owner: str, limit: int) -> Budget:
    month = datetime.now(UTC).strftime("%Y-%m")
    return Budget(f"budget/{kind}/{owner}/{month}", limit, MONTH_EXPIRY_S)
