"""Bearer-key authentication: the FastAPI dependency and the per-replica verifier behind it.

The verifier keeps what the store said about a key for a short time (`key_cache_ttl_s`), so the
database is off the hot path: a cached check is a SHA-256 and a dict lookup. A revocation made
anywhere reaches this replica when the entry expires. Last-used times are collected in memory
and written in one statement every `last_used_flush_s`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from app.accounts.keystore import KeyOwner, KeyStore, keygen
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.schemas import ApiKey, KeyLimits, KeyScopes
from app.accounts.scopes import covers
from app.observability.metrics import authentication_failed
from app.observability.request_record import record_of
from app.openai.errors import ApiError
from app.periodic import PeriodicFlush

logger = logging.getLogger("ray.serve.serviceai")

STORE_RETRY_AFTER_S = 2

MISSING = "Missing Authorization header."
WRONG_SCHEME = "The Authorization header must use the Bearer scheme."
EMPTY = "The Authorization header carries no API key."
REPEATED = "The request carries more than one Authorization header; send exactly one."
MALFORMED = f"The API key is malformed: a ServiceAi key is {keygen.KEY_SHAPE}."
UNKNOWN = "The API key is not recognised."
REVOKED = "The API key has been revoked."
USER_DISABLED = "The account that owns this API key is disabled."
EXPIRED = "The API key expired at {at}."
# The `reason` label of serviceai_authentication_failures: a fixed set, never the key.
_REASON_LABELS = {
    MISSING: "missing",
    WRONG_SCHEME: "wrong_scheme",
    EMPTY: "empty",
    MALFORMED: "malformed",
    UNKNOWN: "unknown",
    REVOKED: "revoked",
    USER_DISABLED: "user_disabled",
    REPEATED: "repeated",
    EXPIRED: "expired",
}


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: the key's id (never the key itself), its owner and plan, and what the
    key's scopes allow."""

    key_id: str
    user_id: str
    plan: str
    models: frozenset[str] | None = None
    """The model types the key may call; None: every type of the plan."""
    expires_at: datetime | None = None
    revokes_at: datetime | None = None
    """A key rotated away: valid until then."""
    key_limits: KeyLimits | None = None
    key_monthly_tokens: int | None = None
    user_monthly_tokens: int | None = None
    manage_keys: bool = True
    """It may create, change, rotate and revoke its user's keys (app.accounts.scopes)."""

    def ended(self, moment: datetime) -> str | None:
        """Why the key no longer works at `moment` (checked on every request, whatever the
        cache holds), or None."""
        if self.revokes_at is not None and self.revokes_at <= moment:
            return REVOKED
        if self.expires_at is not None and self.expires_at <= moment:
            return EXPIRED
        return None

    def may_call(self, model: str) -> bool:
        """A model type, or an adapter of one (`Type:adapter`: app.accounts.scopes.covers)."""
        return self.models is None or covers(self.models, model)

    def scopes(self) -> KeyScopes:
        """The scopes of the key in use: the most a key it makes may have."""
        return KeyScopes(
            models=None if self.models is None else sorted(self.models),
            expires_at=self.expires_at,
            limits=self.key_limits,
            monthly_tokens=self.key_monthly_tokens,
            manage_keys=self.manage_keys,
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a key is refused, and whose it is when the store knows it."""

    reason: str
    key_id: str | None = None
    user_id: str | None = None


Verdict = Caller | Refusal
"""What the store says of a key."""


def verdict_of(owner: KeyOwner | None, key_hash: str) -> Verdict:
    # The lookup is by hash: its timing can only tell an attacker about SHA-256 outputs, which
    # they cannot invert. The comparison of the secret-derived values is constant-time anyway.
    if owner is None or not hmac.compare_digest(owner.key_hash, key_hash):
        return Refusal(UNKNOWN)
    if owner.revoked:
        return Refusal(REVOKED, owner.key_id, owner.user_id)
    if owner.user_disabled:
        return Refusal(USER_DISABLED, owner.key_id, owner.user_id)
    scopes = owner.scopes
    limits = scopes.limits
    return Caller(
        key_id=owner.key_id,
        user_id=owner.user_id,
        plan=owner.plan,
        models=None if scopes.models is None else frozenset(scopes.models),
        expires_at=scopes.expires_at,
        revokes_at=owner.revokes_at,
        key_limits=None if limits is None or limits.is_empty() else limits,
        key_monthly_tokens=scopes.monthly_tokens,
        user_monthly_tokens=owner.user_monthly_tokens,
        manage_keys=scopes.manage_keys,
    )


class VerdictCache:
    """Verdicts by key hash, each for `ttl_s`; at most `max_entries`, the oldest dropped first."""

    def __init__(self, ttl_s: float, max_entries: int, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, tuple[float, Verdict]] = {}

    def get(self, key_hash: str) -> Verdict | None:
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._entries[key_hash]
            return None
        return entry[1]

    def put(self, key_hash: str, verdict: Verdict) -> None:
        if self.ttl_s <= 0:
            return
        self._entries.pop(key_hash, None)
        while len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[key_hash] = (self._clock() + self.ttl_s, verdict)

    def forget(self, *, key_id: str | None = None, user_id: str | None = None) -> None:
        """Drop the entries of a key or of a user's keys (changed on this replica)."""
        stale = [
            key_hash
            for key_hash, (_, verdict) in self._entries.items()
            if (key_id is not None and verdict.key_id == key_id)
            or (user_id is not None and verdict.user_id == user_id)
        ]
        for key_hash in stale:
            del self._entries[key_hash]

    def __len__(self) -> int:
        return len(self._entries)


class KeyVerifier:
    """Turns a bearer token into a `Caller`, or a 401 that says why."""

    def __init__(
        self,
        store: KeyStore,
        *,
        ttl_s: float = 10.0,
        max_entries: int = 100_000,
        flush_every_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        # Refusals get their own, smaller cache: a flood of bad keys cannot evict good ones.
        self.accepted = VerdictCache(ttl_s, max_entries, clock)
        self.refused = VerdictCache(ttl_s, max(1, max_entries // 10), clock)
        self._loading: dict[str, asyncio.Future[Verdict]] = {}
        self._used: dict[str, float] = {}
        self._flusher = PeriodicFlush(self.flush, flush_every_s, "last-used times")

    async def verify(self, token: str) -> Caller:
        if not keygen.is_well_formed(token):
            raise invalid_key(MALFORMED)
        key_hash = keygen.hash_key(token)
        verdict = self.accepted.get(key_hash) or self.refused.get(key_hash)
        if verdict is None:
            verdict = await self._load(key_hash)
        if isinstance(verdict, Refusal):
            raise invalid_key(verdict.reason)
        ended = verdict.ended(datetime.now(UTC))
        if ended is not None:
            expiry = verdict.expires_at
            raise invalid_key(ended, at=None if expiry is None else expiry.isoformat())
        self._used[verdict.key_id] = time.time()
        return verdict

    async def _load(self, key_hash: str) -> Verdict:
        """Ask the store, once for all the requests that wait for the same key."""
        loading = self._loading.get(key_hash)
        if loading is None:
            loading = asyncio.ensure_future(self._ask_store(key_hash))
            self._loading[key_hash] = loading
            loading.add_done_callback(lambda _: self._loading.pop(key_hash, None))
        # A request that gives up must not cancel the lookup the others wait for.
        return await asyncio.shield(loading)

    async def _ask_store(self, key_hash: str) -> Verdict:
        verdict = verdict_of(await self.store.find_key(key_hash), key_hash)
        (self.accepted if isinstance(verdict, Caller) else self.refused).put(key_hash, verdict)
        return verdict

    def forget(self, *, key_id: str | None = None, user_id: str | None = None) -> None:
        self.accepted.forget(key_id=key_id, user_id=user_id)
        self.refused.forget(key_id=key_id, user_id=user_id)

    async def revoke(
        self, key_id: str, *, owner_id: str | None = None, actor: Actor | None = None
    ) -> ApiKey:
        """Revoke a key in the store; this replica refuses it at once, the others within TTL."""
        revoked = await self.store.revoke_key(key_id, owner_id=owner_id, actor=actor)
        self.forget(key_id=key_id)
        return revoked

    # Last-used times, written in batches.

    def start(self) -> None:
        self._flusher.start()

    async def flush(self) -> None:
        used, self._used = self._used, {}
        if not used:
            return
        try:
            await self.store.record_last_used(
                {key_id: datetime.fromtimestamp(t, UTC) for key_id, t in used.items()}
            )
        except KeyStoreError:
            # Keep them for the next round; newer uses made meanwhile win.
            for key_id, t in used.items():
                self._used[key_id] = max(t, self._used.get(key_id, t))

    async def close(self) -> None:
        await self._flusher.stop()


def invalid_key(reason: str, *, at: str | None = None) -> ApiError:
    authentication_failed(_REASON_LABELS[reason])
    message = reason.format(at=(at or "").replace("+00:00", "Z"))
    return ApiError(
        401,
        f"{message} Send 'Authorization: Bearer <API_KEY>' with a valid key.",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="A ServiceAi API key: `Authorization: Bearer sai-...`.",
)


def bearer_token(request: Request) -> str:
    """The token of a `Bearer` Authorization header, or without one of an `x-api-key` header
    (Anthropic's clients send theirs so), or a 401 naming what is wrong with it."""
    headers = request.headers.getlist("authorization")
    if not headers or not headers[0]:
        return api_key_header(request)
    # Proxies disagree on which of several to use: refuse rather than guess.
    if len(headers) > 1:
        raise invalid_key(REPEATED)
    header = headers[0]
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        raise invalid_key(WRONG_SCHEME)
    token = token.strip()
    if not token:
        raise invalid_key(EMPTY)
    return token


def api_key_header(request: Request) -> str:
    """The key of the one `x-api-key` header, or the 401 of a request that carries none."""
    keys = request.headers.getlist("x-api-key")
    if len(keys) > 1:
        raise invalid_key(REPEATED)
    if not keys or not keys[0].strip():
        raise invalid_key(MISSING)
    return keys[0].strip()


async def authenticate(
    request: Request, _: HTTPAuthorizationCredentials | None = Security(_bearer)
) -> Caller:
    caller = request.scope.get("state", {}).get("caller")
    if caller is None:
        caller = await request.app.state.keys.verify(bearer_token(request))
    record_of(request).key_id = caller.key_id
    return caller


# Methods whose requests carry a body the API parses.
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class AuthenticateFirst:
    """ASGI middleware: a request with a body under `prefix` is authenticated before a byte of
    its body is read, so a stranger's body is never parsed or validated (a 401 at once).

    The `authenticate` dependency then takes the caller found here.
    """

    def __init__(self, app: ASGIApp, verifier: KeyVerifier, prefix: str = "/v1/") -> None:
        self.app = app
        self.verifier = verifier
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The path under the app's own prefix (a Serve route_prefix is the root_path).
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if (
            scope["type"] == "http"
            and scope["method"] in _WITH_BODY
            and path.startswith(self.prefix)
        ):
            try:
                caller = await self.verifier.verify(bearer_token(Request(scope)))
            except (ApiError, KeyStoreError) as exc:
                error = store_error(exc) if isinstance(exc, KeyStoreError) else exc
                _match_route(scope)  # the refusal is counted and logged under its route
                await error.response(path)(scope, receive, send)
                return
            scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)


def _match_route(scope: Scope) -> None:
    """Set the route the router would have picked (FastAPI's routes put it in `scope`)."""
    for route in scope["app"].router.routes:
        match, child_scope = route.matches(scope)
        if match is Match.FULL:
            scope.update(child_scope)
            return


def store_error(exc: KeyStoreError) -> ApiError:
    """The API error of a key store failure: a 503 with Retry-After when it is unreachable."""
    unavailable = exc.status >= 500
    return ApiError(
        exc.status,
        exc.message,
        type="server_error" if unavailable else "invalid_request_error",
        param=exc.param,
        code=exc.code,
        headers={"Retry-After": str(STORE_RETRY_AFTER_S)} if unavailable else None,
    )
