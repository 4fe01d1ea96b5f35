"""The users and keys of the store as the admin API, the account API and `--json` show them.

Times are Unix seconds, as in the rest of the OpenAI format. A key's secret appears only in
`IssuedApiKey`, once, in the answer to its creation.
"""

from __future__ import annotations

import datetime as dt
import re
from datetime import datetime
from typing import Annotated, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    field_validator,
)

from app.accounts.keystore import passwords
from deployments.wire import ADAPTER_NAME

DEFAULT_PLAN = "free"
MAX_PAGE = 1000

Count = Annotated[int, Field(gt=0, le=2**31 - 1)]
"""A positive number of requests: what the store's Integer columns hold in PostgreSQL."""
TokenCount = Annotated[int, Field(gt=0, le=2**63 - 1)]
"""A positive number of tokens: what the store's BigInteger columns hold."""

_PLAN = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def _plan_name(value: str) -> str:
    if not _PLAN.fullmatch(value):
        raise ValueError("must be 1-32 lower-case letters, digits, '-' or '_' (e.g. free, pro)")
    return value


PlanName = Annotated[
    str,
    AfterValidator(_plan_name),
    Field(description="A plan of the rate-limit configuration, e.g. 'free' or 'pro'."),
]


def _normalize_email(value: str) -> str:
    value = value.strip().lower()
    local, at, domain = value.partition("@")
    if not at or not local or not domain or "@" in domain or any(c.isspace() for c in value):
        raise ValueError("is not an email address")
    return value


Email = Annotated[str, StringConstraints(max_length=320), AfterValidator(_normalize_email)]


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError("must not contain control characters")
    return value


KeyName = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=100),
    AfterValidator(_printable),
]


def _password_length(value: SecretStr) -> SecretStr:
    if not passwords.MIN_LENGTH <= len(value.get_secret_value()) <= passwords.MAX_LENGTH:
        raise ValueError(
            f"must be at least {passwords.MIN_LENGTH} characters "
            f"(and at most {passwords.MAX_LENGTH})"
        )
    return value


Password = Annotated[SecretStr, AfterValidator(_password_length)]
"""A new console password: long enough to resist guessing, short enough to hash cheaply."""


def unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


MAX_GRACE_S = 30 * 86400
DEFAULT_GRACE_S = 86400

ModelTypeName = Annotated[str, StringConstraints(min_length=1, max_length=64)]

Role = Literal["user", "admin"]
""""admin": an operator, who may use the console's operator pages."""


class User(BaseModel):
    object: Literal["user"] = "user"
    id: str
    email: str
    plan: str
    created_at: int
    disabled: bool
    disabled_at: int | None
    monthly_tokens: int | None = Field(
        None,
        description="Tokens all the user's keys may use in a UTC calendar month; null: "
        "no budget beyond the plan.",
    )
    role: Role = "user"


class KeyLimits(BaseModel):
    """A key's own limits, each optional, applied across model types together with its user's
    plan (per model type): the tighter one wins."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: Count | None = None
    tokens_per_minute: TokenCount | None = None
    concurrent_requests: Count | None = None
    tokens_per_day: TokenCount | None = None

    def is_empty(self) -> bool:
        return all(value is None for value in self.model_dump().values())


class KeyScopes(BaseModel):
    """What a key may do beyond being its user's: all optional, none by default."""

    model_config = ConfigDict(extra="forbid")

    models: list[ModelTypeName] | None = Field(
        None, min_length=1, description="The model types it may call; null: all of them."
    )
    expires_at: AwareDatetime | None = Field(
        None, description="When it stops working (ISO 8601); null: never."
    )
    limits: KeyLimits | None = None
    monthly_tokens: TokenCount | None = Field(
        None, description="Tokens it may use in a UTC calendar month; null: no budget."
    )
    manage_keys: bool = Field(
        True,
        description="It may create, change, rotate and revoke its user's keys through "
        "/v1/account/keys (at most as wide as itself); false: it revokes only itself.",
    )

    def has_limits(self) -> bool:
        """It has counters of its own (a window or a budget), which a key it made would not
        share."""
        return self.monthly_tokens is not None or not (self.limits or KeyLimits()).is_empty()

    @field_validator("expires_at")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        """The moment in UTC, as the key store keeps it: an offset that carries it past the
        years 1-9999 (0001-01-01T00:00:00+00:01) is refused here, not by the store."""
        if value is None:
            return None
        try:
            return value.astimezone(dt.UTC)
        except OverflowError:
            raise ValueError("the moment in UTC falls outside the years 1-9999") from None


class ApiKey(KeyScopes):
    """A key as lists show it: never the secret, only `display` (prefix and last 4 characters)."""

    model_config = ConfigDict(extra="ignore")

    object: Literal["api_key"] = "api_key"
    id: str
    user_id: str
    name: str | None
    display: str = Field(examples=["sai-...x9Qz"])
    created_at: int
    last_used_at: int | None
    revoked_at: int | None = Field(
        description="When it was revoked, or will be (a key rotated away, in its grace period)."
    )
    revoked: bool
    limits: KeyLimits = Field(default_factory=KeyLimits)


class IssuedApiKey(ApiKey):
    key: str = Field(description="The secret key. Shown only in this response: store it now.")


Item = TypeVar("Item", User, ApiKey)
Order = Literal["asc", "desc"]
"""A list's order by creation: oldest first (`asc`, the default) or newest first."""


class Page(BaseModel, Generic[Item]):
    """One page of a list, in the order asked for; pass the last id as `after` for the next one."""

    object: Literal["list"] = "list"
    data: list[Item]
    has_more: bool


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: Email
    plan: PlanName = DEFAULT_PLAN


class UserUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: PlanName | None = None
    disabled: bool | None = None
    monthly_tokens: TokenCount | None = Field(
        None, description="A monthly token budget; send null to clear it."
    )
    role: Role | None = Field(None, description="'admin' makes the user an operator.")


class PasswordSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    password: Password


class ApiKeyCreate(KeyScopes):
    name: KeyName | None = None


class ApiKeyUpdate(KeyScopes):
    """The scopes to change: a field sent replaces the key's (null clears it), a field left out
    keeps it."""


class ApiKeyRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_seconds: int = Field(
        DEFAULT_GRACE_S,
        ge=0,
        le=MAX_GRACE_S,
        description="How long the old key keeps working before it is revoked.",
    )


class UsageRecord(BaseModel):
    """What one key used of one model type on one UTC day (its replies' `usage`, summed)."""

    object: Literal["usage"] = "usage"
    date: dt.date = Field(description="The UTC day, YYYY-MM-DD.")
    user_id: str
    key_id: str
    model: str = Field(description="The model type, e.g. ServiceAi-Pro.")
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Budget(BaseModel):
    """A monthly token budget and what was used of it this UTC month (as written so far)."""

    month: str = Field(examples=["2026-11"])
    monthly_tokens: int
    used: int
    left: int


class UsageList(BaseModel):
    """Usage between two UTC days (both included), by day, then key, then model type; with the
    monthly budget of the user or the key asked about, if it has one."""

    object: Literal["list"] = "list"
    start_date: dt.date
    end_date: dt.date
    data: list[UsageRecord]
    budget: Budget | None = None


class AuditEntry(BaseModel):
    """One operator action, as the audit log keeps it."""

    object: Literal["audit_entry"] = "audit_entry"
    id: int
    at: int = Field(description="When, in Unix seconds.")
    source: Literal["console", "cli", "admin_api"] = Field(description="Through which door.")
    actor: str = Field(
        description="The operator's email (console), the system user (cli) or "
        "'admin token' (admin API)."
    )
    action: str = Field(examples=["user.set_plan", "key.revoke"])
    target: str = Field(description="The user's email or the key's id acted on.")
    detail: str | None = None


class AuditPage(BaseModel):
    """A page of the audit log, newest first; pass the last id as `before` for the next one."""

    object: Literal["list"] = "list"
    data: list[AuditEntry]
    has_more: bool


class UsageTotals(BaseModel):
    """One model type's usage summed over a day and over all of a user's keys."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class AdapterCreate(BaseModel):
    """A LoRA adapter to register on a model type (which must take adapters: enable_lora)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="The model type it adapts.", examples=["ServiceAi-Coder"])
    name: str = Field(
        pattern=ADAPTER_NAME,
        description="Its own name: clients call it as `model:name`.",
        examples=["acme-sql"],
    )
    path: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4096)
    ] = Field(
        description="Where each replica loads it from: a folder in PEFT's format that "
        "every GPU node can read, or a Hugging Face id.",
    )


class Adapter(BaseModel):
    """A registered LoRA adapter."""

    object: Literal["lora_adapter"] = "lora_adapter"
    id: str = Field(description="What clients call it: `model:name`.")
    model: str
    name: str
    path: str
    created_at: int = Field(description="When it was registered, in Unix seconds.")


class AdapterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Adapter]
