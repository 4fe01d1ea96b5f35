"""Every environment setting of the service, in one place (prefix SERVICEAI_).

Secrets and per-environment addresses live here; the shape of the deployment (model types,
replicas, plans) lives in serve_config.yaml.
"""

from __future__ import annotations

from functools import lru_cache
from ipaddress import ip_network
from pathlib import Path
from typing import Literal

from limits import parse_many
from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.http.body_limit import DEFAULT_BODY_READ_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATABASE_URL = f"sqlite+aiosqlite:///{PROJECT_ROOT / '.serviceai' / 'serviceai.db'}"
MIN_ADMIN_TOKEN_LENGTH = 24
MIN_SESSION_SECRET_LENGTH = 32
_MIN_SECRET_LENGTHS = {
    "admin_token": MIN_ADMIN_TOKEN_LENGTH,
    "session_secret": MIN_SESSION_SECRET_LENGTH,
    "session_secret_previous": MIN_SESSION_SECRET_LENGTH,
}

# The async drivers we ship, and the plain URL schemes an operator may write instead.
_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
}


class Settings(BaseSettings):
    # A refused value may be a secret (a database URL carries its password): never echo it.
    model_config = SettingsConfigDict(
        env_prefix="SERVICEAI_", extra="ignore", hide_input_in_errors=True
    )

    database_url: SecretStr = Field(
        SecretStr(DEFAULT_DATABASE_URL),
        description="The key store: a SQLite file (default, under .serviceai/) or PostgreSQL "
        "(postgresql+asyncpg://user:password@host/db). Secret: it may carry a password.",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token of the /admin API; unset, the admin API is off. "
        f"At least {MIN_ADMIN_TOKEN_LENGTH} characters.",
    )
    key_cache_ttl_s: float = Field(
        10.0,
        ge=0,
        le=300,
        description="How long an ingress replica trusts a verified key without asking the "
        "store; a revocation reaches every replica within this time. 0 disables the cache. "
        "The LoRA adapters registered in the store are read as often.",
    )
    migration_attempts: int = Field(
        2,
        ge=0,
        le=10,
        description="How many other replicas a request may go on on after its replica or "
        "engine failed it (app/serving/migration.py): a whole reply or a stream not yet begun "
        "starts over, a chat or completion stream continues from where it was cut. 0: the "
        "client gets the 503 instead.",
    )
    key_cache_size: int = Field(
        100_000, ge=1, description="Verified keys each ingress replica keeps at most."
    )
    last_used_flush_s: float = Field(
        15.0, gt=0, description="How often a replica writes the keys' last-used times, batched."
    )
    max_keys_per_user: int = Field(50, ge=1, description="Active keys one user may hold.")
    redis_url: SecretStr | None = Field(
        None,
        description="Rate-limit counters in Redis (redis://[:password@]host:6379/0 or rediss://), "
        "shared by every ingress replica. Unset: in each replica's memory. Secret: it may carry "
        "a password.",
    )
    redis_key_prefix: str = Field(
        "serviceai", min_length=1, description="Prefix of every Redis key the service writes."
    )
    redis_timeout_s: float = Field(
        2.0,
        gt=0,
        description="How long a rate-limit storage call may wait (for a connection, to connect, "
        "for the reply) before Redis counts as unreachable.",
    )
    rate_limit_fail_open: bool = Field(
        False,
        description="When the rate-limit storage (Redis) cannot be reached: refuse with 503 "
        "and Retry-After (false, the default: no limit, budget or concurrency cap is ever "
        "off), or serve without any of them and log a warning (true).",
    )
    usage_flush_s: float = Field(
        15.0, gt=0, description="How often a replica writes its usage counts, batched."
    )
    usage_journal_dir: Path | None = Field(
        None,
        description="Where each replica appends the usage it served before the batched write, "
        "so that a killed replica's is replayed by the next (default: a folder per key store "
        "under the system's temporary folder).",
    )
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES,
        ge=1024,
        description="Largest request body accepted, in bytes; a larger one is refused with 413 "
        "while it is read, whether it declares its length or comes chunked.",
    )
    body_read_timeout_s: float = Field(
        DEFAULT_BODY_READ_TIMEOUT_S,
        gt=0,
        le=600,
        description="How long a request body may take to arrive once the service reads it; a "
        "slower one is refused with 408.",
    )
    stream_feed_min_streams: int = Field(
        16,
        ge=0,
        description="Streams an ingress replica runs on one model replica before it opens a feed "
        "there: one message per engine step for all of them instead of one per stream "
        "(bench/NOTES.md). 0: every stream on its own call.",
    )
    api_docs: bool = Field(
        True,
        description="Serve /docs, /redoc and /openapi.json. Production turns them off.",
    )
    admin_api: bool = Field(
        True,
        description="Serve /admin when SERVICEAI_ADMIN_TOKEN is set; false keeps it off the "
        "public listener whatever the token (operators use the `serviceai` CLI there).",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins that may call the API (a JSON list, e.g. "
        '["http://localhost:3000"]); empty: CORS closed, no browser page can read an answer.',
    )
    response_retention_s: float = Field(
        30 * 86400,
        gt=0,
        description="How long a stored /v1/responses reply (with the input it saw) is kept, in "
        "seconds (default 30 days); then it is gone for every route and purged.",
    )
    response_max_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest stored response (its input, replayed history included, and its "
        "output, as JSON); a longer conversation is refused with 400 while store is true.",
    )
    adapter_roots: list[Path] = Field(
        default_factory=lambda: [PROJECT_ROOT / "models"],
        description="Folders a LoRA adapter registered at run time (admin API, CLI) must lie "
        "in (a JSON list; default: the project's models folder); any other path is refused.",
    )
    adapter_hub_ids: bool = Field(
        True,
        description="Whether a registered adapter may be a Hugging Face id (owner/name), which "
        "the model replicas download.",
    )
    response_user_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Most bytes of unexpired stored responses one user may hold (default "
        "256 MiB); past it a request with store true is refused with 400 "
        "stored_responses_limit_reached until some are deleted or expire.",
    )
    response_purge_every_s: float = Field(
        3600.0, gt=0, description="How often each ingress replica deletes expired responses."
    )
    public_base_url: str = Field(
        "http://127.0.0.1:8000/v1",
        pattern=r"^https?://",
        description="The base URL clients use; shown in messages and the console's quick-start. "
        "An https:// URL also makes the console's session cookie Secure.",
    )
    session_secret: SecretStr | None = Field(
        None,
        description="Signs the console's session cookies. Unset: each process makes a random "
        "one, so sessions end with the replica and do not carry over to other replicas (set it "
        f"when the ingress has more than one). At least {MIN_SESSION_SECRET_LENGTH} characters.",
    )
    session_secret_previous: SecretStr | None = Field(
        None,
        description="A session secret still accepted, not used to sign: to rotate the secret "
        "without signing anyone out (docs/operations.md, 'Rotating secrets'). A session it "
        "signed is signed again with session_secret on the next page.",
    )
    session_idle_s: int = Field(
        8 * 3600,
        ge=60,
        le=30 * 86400,
        description="A console session ends after this long without a page view.",
    )
    sign_in_limit_per_email: str = Field(
        "5/minute;20/hour",
        description="Console sign-in attempts per email and ingress replica ('limits' syntax).",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description='Addresses or networks (a JSON list, e.g. ["10.0.0.0/16"]) of the proxies '
        "in front of the ingress (the load balancer; the node's HAProxy, which connects from "
        "loopback and appends the address it saw). Only a request from one of them has its "
        "X-Forwarded-For read for the console's per-address sign-in limit; empty: the header is "
        "ignored and the peer's address counts.",
    )
    sign_up: Literal["open", "approval", "off"] = Field(
        "open",
        description="Console sign-up: 'open' (an account at once, signed in; an email already "
        "registered is told so), 'approval' (the same answer for every email; a new account "
        "starts disabled until an operator runs `serviceai users enable`), 'off' (no sign-up).",
    )
    sign_in_limit_per_address: str = Field(
        "30/minute;300/hour",
        description="Console sign-in and sign-up attempts per client address and replica.",
    )
    sign_in_limit_shared: str = Field(
        "300/minute",
        description="Console attempts per replica, all together, of clients whose address "
        "cannot be known (a trusted proxy that names none): sized to the password hashing a "
        "replica can afford (argon2id, about 130 ms of a core each on a 2-core machine).",
    )

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in _DRIVERS:
            raise ValueError(
                "must be a sqlite:///PATH or postgresql://USER@HOST/DB URL "
                "(drivers: sqlite+aiosqlite, postgresql+asyncpg)"
            )
        return SecretStr(f"{_DRIVERS[scheme]}://{rest}")

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        if not value.get_secret_value().startswith(("redis://", "rediss://")):
            raise ValueError("must be a redis://HOST:PORT/DB or rediss://HOST:PORT/DB URL")
        return value

    @field_validator("admin_token", "session_secret", "session_secret_previous")
    @classmethod
    def _long_enough(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is not None and not value.get_secret_value():
            return None
        minimum = _MIN_SECRET_LENGTHS[str(info.field_name)]
        if value is not None and len(value.get_secret_value()) < minimum:
            raise ValueError(
                f"must be at least {minimum} characters "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for proxy in value:
            try:
                ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"{proxy!r} is not an IP address or network") from None
        return value

    @field_validator("sign_in_limit_per_email", "sign_in_limit_per_address", "sign_in_limit_shared")
    @classmethod
    def _rate_limits(cls, value: str) -> str:
        try:
            parse_many(value)
        except ValueError:
            raise ValueError(
                "must be rate limits such as '5/minute' or '5/minute;20/hour'"
            ) from None
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
