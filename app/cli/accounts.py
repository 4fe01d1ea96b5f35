"""`serviceai users ...`, `serviceai keys ...`, `serviceai usage` and `serviceai audit`: accounts,
keys, their usage and the operators' actions in the key store.

Every command opens the store named by SERVICEAI_DATABASE_URL (upgrading its schema), prints a
table or, with --json, the same JSON the admin API returns. Exit codes: 0 done, 1 refused (not
found, already exists, limit), 2 bad usage or configuration, 3 key store unreachable.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import NoReturn, TypeVar

import typer
from pydantic import BaseModel, ValidationError

from app.accounts.keystore import KeyStore, open_store
from app.accounts.keystore.audit import LAST_ID, Actor
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.schemas import (
    DEFAULT_GRACE_S,
    DEFAULT_PLAN,
    ApiKey,
    ApiKeyCreate,
    ApiKeyRotate,
    ApiKeyUpdate,
    AuditPage,
    IssuedApiKey,
    PasswordSet,
    UsageList,
    User,
    UserCreate,
    UserUpdate,
)
from app.config.settings import Settings, get_settings

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3

EXIT_CODES = (
    "Store: SERVICEAI_DATABASE_URL. Exit codes: 0 done, 1 refused (not found, exists, limit), "
    "2 bad usage or configuration, 3 key store unreachable."
)
users = typer.Typer(
    help="Accounts: create, list, disable, enable, change plan, set a console password.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)
keys = typer.Typer(
    help="API keys: create (shown once), list, scope, rotate, revoke.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)

JsonOption = typer.Option(False, "--json", help="Print JSON (as the admin API returns it).")


class ListOrder(StrEnum):
    asc = "asc"
    desc = "desc"


OrderOption = typer.Option(ListOrder.asc, "--order", help="asc: oldest first; desc: newest first.")
T = TypeVar("T")
Model = TypeVar("Model", bound=BaseModel)


def fail(message: str, code: int) -> NoReturn:
    typer.secho(f"Error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def settings_or_exit() -> Settings:
    try:
        return get_settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"SERVICEAI_{'_'.join(map(str, e['loc'])).upper()} "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        fail(f"invalid configuration: {problems}", EXIT_USAGE)


def with_store(operation: Callable[[KeyStore], Awaitable[T]]) -> T:
    """Run one operation against the configured store, turning its refusals into exit codes."""
    settings = settings_or_exit()

    async def main() -> T:
        store = await open_store(settings)
        try:
            return await operation(store)
        finally:
            await store.database.close()

    try:
        return asyncio.run(main())
    except KeyStoreError as exc:
        fail(exc.message, EXIT_UNAVAILABLE if exc.status >= 500 else EXIT_REFUSED)


def validated(model: type[Model], **fields: object) -> Model:
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(map(str, first["loc"])).replace("_", "-")
        fail(f"--{name}: {first['msg'].removeprefix('Value error, ')}", EXIT_USAGE)


def when(unix_time: int | None) -> str:
    if unix_time is None:
        return "-"
    return datetime.fromtimestamp(unix_time, UTC).strftime("%Y-%m-%d %H:%M")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    for line in (headers, *rows):
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())


class UserWithKey(BaseModel):
    """`users create --with-key --json`: the user and their first key (with its secret)."""

    user: User
    key: IssuedApiKey


def print_json(value: BaseModel) -> None:
    typer.echo(value.model_dump_json(indent=2))


def print_user(user: User) -> None:
    status = "disabled" if user.disabled else "active"
    operator = ", an operator" if user.role == "admin" else ""
    typer.echo(f"User {user.id}: {user.email}, plan {user.plan}, {status}{operator}.")


def print_issued(key: IssuedApiKey) -> None:
    name = f' "{key.name}"' if key.name else ""
    typer.echo(f"Key {key.id}{name} ({key.display}) for {key.user_id}:\n\n    {key.key}\n")
    typer.echo("Copy it now: it is not shown again.")


@users.command("create")
def create_user(
    email: str = typer.Option(..., help="The user's email (unique)."),
    plan: str = typer.Option(DEFAULT_PLAN, help="The rate-limit plan."),
    with_key: bool = typer.Option(
        False, "--with-key", help="Also create a first key and print it once."
    ),
    key_name: str = typer.Option("default", help="Name of the first key (with --with-key)."),
    as_json: bool = JsonOption,
) -> None:
    """Create a user (and, with --with-key, their first API key)."""
    body = validated(UserCreate, email=email, plan=plan)
    name = validated(ApiKeyCreate, name=key_name).name

    async def create(store: KeyStore) -> tuple[User, IssuedApiKey | None]:
        actor = Actor.command_line()
        user = await store.create_user(body.email, body.plan, actor=actor)
        return user, (await store.create_key(user.id, name, actor=actor) if with_key else None)

    user, key = with_store(create)
    if as_json:
        print_json(user if key is None else UserWithKey(user=user, key=key))
        return
    print_user(user)
    if key is not None:
        print_issued(key)


@users.command("list")
def list_users(
    limit: int = typer.Option(1000, min=1, max=1000, help="At most this many."),
    after: str = typer.Option(None, help="Start after this user id."),
    order: ListOrder = OrderOption,
    as_json: bool = JsonOption,
) -> None:
    """List users."""
    page = with_store(lambda store: store.list_users(limit=limit, after=after, order=order.value))
    if as_json:
        print_json(page)
        return
    table(
        ["ID", "EMAIL", "PLAN", "STATUS", "CREATED"],
        [
            [u.id, u.email, u.plan, "disabled" if u.disabled else "active", when(u.created_at)]
            for u in page.data
        ],
    )
    if page.has_more:
        typer.echo(f"... more: --after {page.data[-1].id}")


def _update(user: str, as_json: bool, **change: object) -> None:
    body = validated(UserUpdate, **change)
    budget = {"monthly_tokens": body.monthly_tokens} if "monthly_tokens" in change else {}
    updated = with_store(
        lambda store: store.update_user(
            user,
            plan=body.plan,
            disabled=body.disabled,
            role=body.role,
            actor=Actor.command_line(),
            **budget,
        )
    )
    print_json(updated) if as_json else print_user(updated)


@users.command("set-budget")
def set_budget(
    user: str = typer.Argument(..., help="User id or email."),
    monthly_tokens: int = typer.Option(
        None, "--monthly-tokens", help="Tokens all the user's keys may use in a UTC month."
    ),
    none: bool = typer.Option(False, "--none", help="Clear the budget."),
    as_json: bool = JsonOption,
) -> None:
    """Set (or clear) a user's monthly token budget, beside their plan's limits."""
    if none == (monthly_tokens is not None):
        fail("give either --monthly-tokens N or --none", EXIT_USAGE)
    _update(user, as_json, monthly_tokens=monthly_tokens)


@users.command("disable")
def disable_user(
    user: str = typer.Argument(..., help="User id or email."), as_json: bool = JsonOption
) -> None:
    """Disable a user: all their keys stop working (within the key cache TTL)."""
    _update(user, as_json, disabled=True)


@users.command("enable")
def enable_user(
    user: str = typer.Argument(..., help="User id or email."), as_json: bool = JsonOption
) -> None:
    """Enable a disabled user again: their keys that are not revoked work again."""
    _update(user, as_json, disabled=False)


@users.command("set-plan")
def set_plan(
    user: str = typer.Argument(..., help="User id or email."),
    plan: str = typer.Argument(..., help="The new plan."),
    as_json: bool = JsonOption,
) -> None:
    """Move a user to another plan."""
    _update(user, as_json, plan=plan)


@users.command("set-role")
def set_role(
    user: str = typer.Argument(..., help="User id or email."),
    role: str = typer.Argument(..., help="admin (an operator of the console) or user."),
    as_json: bool = JsonOption,
) -> None:
    """Make a user an operator (admin) of the console, or take it back (user)."""
    _update(user, as_json, role=role)


@users.command("set-password")
def set_password(
    user: str = typer.Argument(..., help="User id or email."),
    password_stdin: bool = typer.Option(
        False, "--password-stdin", help="Read the password from the first line of standard input."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Set a user's console password (users made here or by the admin API have none)."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    body = validated(PasswordSet, password=password)
    updated = with_store(
        lambda store: store.set_password(
            user, body.password.get_secret_value(), actor=Actor.command_line()
        )
    )
    if as_json:
        print_json(updated)
        return
    typer.echo(f"User {updated.id} ({updated.email}) can now sign in to the console.")


_DURATION = re.compile(r"(\d+)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds_of(text: str, option: str) -> int:
    """'30d', '24h', '90m', '45s' in seconds; a usage error naming `option` otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        fail(f"{option}: '{text}' is not a duration such as 30d, 24h, 90m or 45s", EXIT_USAGE)
    return int(match[1]) * _SECONDS[match[2]]


ModelsOption = typer.Option(
    None,
    "--models",
    help="Comma-separated model types the key may call (e.g. "
    "ServiceAi-Fast,ServiceAi-Coder); default all.",
)
ExpiresInOption = typer.Option(None, "--expires-in", help="Expire after 30d, 24h, 90m...")
ExpiresAtOption = typer.Option(
    None, "--expires-at", help="Expire at this time, ISO 8601 (2027-01-31T00:00:00Z)."
)
RpmOption = typer.Option(None, "--requests-per-minute", help="The key's own request rate.")
TpmOption = typer.Option(None, "--tokens-per-minute", help="The key's own token rate.")
ConcurrentOption = typer.Option(
    None, "--concurrent-requests", help="The key's own requests at once."
)
TpdOption = typer.Option(None, "--tokens-per-day", help="The key's own daily tokens (UTC).")
MonthlyOption = typer.Option(
    None, "--monthly-tokens", help="The key's token budget per UTC calendar month."
)


def scope_fields(
    models: str | None,
    expires_in: str | None,
    expires_at: str | None,
    limits: dict[str, int | None],
    monthly_tokens: int | None,
) -> dict[str, object]:
    """The scope fields the options give (only those given)."""
    fields: dict[str, object] = {}
    if models is not None:
        fields["models"] = [m.strip() for m in models.split(",") if m.strip()]
    if expires_in is not None and expires_at is not None:
        fail("give --expires-in or --expires-at, not both", EXIT_USAGE)
    if expires_in is not None:
        fields["expires_at"] = datetime.now(UTC) + timedelta(
            seconds=seconds_of(expires_in, "--expires-in")
        )
    if expires_at is not None:
        fields["expires_at"] = expires_at
    given = {name: value for name, value in limits.items() if value is not None}
    if given:
        fields["limits"] = given
    if monthly_tokens is not None:
        fields["monthly_tokens"] = monthly_tokens
    return fields


def print_scopes(key: ApiKey) -> None:
    limits = {k: v for k, v in key.limits.model_dump().items() if v is not None}
    typer.echo(
        f"  models: {', '.join(key.models) if key.models else 'all'}; expires: "
        f"{key.expires_at.isoformat().replace('+00:00', 'Z') if key.expires_at else 'never'}; "
        f"limits: {', '.join(f'{k} {v}' for k, v in limits.items()) or 'the plan only'}; "
        f"monthly tokens: {key.monthly_tokens if key.monthly_tokens is not None else 'no budget'}"
    )


@keys.command("create")
def create_key(
    user: str = typer.Option(..., help="The owner: user id or email."),
    name: str = typer.Option(None, help="A name to tell the key apart."),
    models: str = ModelsOption,
    expires_in: str = ExpiresInOption,
    expires_at: str = ExpiresAtOption,
    requests_per_minute: int = RpmOption,
    tokens_per_minute: int = TpmOption,
    concurrent_requests: int = ConcurrentOption,
    tokens_per_day: int = TpdOption,
    monthly_tokens: int = MonthlyOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a key, scoped if asked, and print it once (the store keeps only its hash)."""
    limits = dict(
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        concurrent_requests=concurrent_requests,
        tokens_per_day=tokens_per_day,
    )
    body = validated(
        ApiKeyCreate,
        name=name,
        **scope_fields(models, expires_in, expires_at, limits, monthly_tokens),
    )
    key = with_store(
        lambda store: store.create_key(user, body.name, body, actor=Actor.command_line())
    )
    if as_json:
        print_json(key)
        return
    print_issued(key)
    print_scopes(key)


@keys.command("update")
def update_key(
    key_id: str = typer.Argument(..., help="The key's id (key_...)."),
    models: str = ModelsOption,
    all_models: bool = typer.Option(False, "--all-models", help="Let it call every type."),
    expires_in: str = ExpiresInOption,
    expires_at: str = ExpiresAtOption,
    no_expiry: bool = typer.Option(False, "--no-expiry", help="Let it never expire."),
    requests_per_minute: int = RpmOption,
    tokens_per_minute: int = TpmOption,
    concurrent_requests: int = ConcurrentOption,
    tokens_per_day: int = TpdOption,
    monthly_tokens: int = MonthlyOption,
    as_json: bool = JsonOption,
) -> None:
    """Change a key's scopes: what is given replaces what it had; the rest stays. Replicas see
    it within the key cache TTL."""
    limits = dict(
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        concurrent_requests=concurrent_requests,
        tokens_per_day=tokens_per_day,
    )
    fields = scope_fields(models, expires_in, expires_at, {}, monthly_tokens)
    if all_models:
        fields["models"] = None
    if no_expiry:
        fields["expires_at"] = None
    given = {name: value for name, value in limits.items() if value is not None}

    async def update(store: KeyStore) -> ApiKey:
        if given:  # one limit given changes that limit only
            current = (await store.get_key(key_id)).limits.model_dump()
            fields["limits"] = {**current, **given}
        body = validated(ApiKeyUpdate, **fields)
        return await store.update_key(
            key_id, body.model_dump(include=body.model_fields_set), actor=Actor.command_line()
        )

    key = with_store(update)
    if as_json:
        print_json(key)
        return
    typer.echo(f"Key {key.id} ({key.display}) updated:")
    print_scopes(key)


@keys.command("rotate")
def rotate_key(
    key_id: str = typer.Argument(..., help="The key's id (key_...)."),
    grace: str = typer.Option(
        f"{DEFAULT_GRACE_S // 3600}h", help="How long the old key keeps working (24h, 90m, 0s)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """A new key with the same name and scopes, printed once; the old one works for the grace
    period, then is revoked."""
    body = validated(ApiKeyRotate, grace_seconds=seconds_of(grace, "--grace"))
    key = with_store(
        lambda store: store.rotate_key(
            key_id, timedelta(seconds=body.grace_seconds), actor=Actor.command_line()
        )
    )
    if as_json:
        print_json(key)
        return
    print_issued(key)
    typer.echo(f"The old key {key_id} works for {grace} more, then is revoked.")


@keys.command("list")
def list_keys(
    user: str = typer.Option(None, help="Only this user's keys (id or email)."),
    limit: int = typer.Option(1000, min=1, max=1000, help="At most this many."),
    after: str = typer.Option(None, help="Start after this key id."),
    order: ListOrder = OrderOption,
    as_json: bool = JsonOption,
) -> None:
    """List keys (never their secrets)."""
    page = with_store(
        lambda store: store.list_keys(user, limit=limit, after=after, order=order.value)
    )
    if as_json:
        print_json(page)
        return
    table(
        ["ID", "KEY", "NAME", "USER", "STATUS", "CREATED", "LAST USED"],
        [
            [
                k.id,
                k.display,
                k.name or "-",
                k.user_id,
                "revoked" if k.revoked else "active",
                when(k.created_at),
                when(k.last_used_at),
            ]
            for k in page.data
        ],
    )
    if page.has_more:
        typer.echo(f"... more: --after {page.data[-1].id}")


@keys.command("revoke")
def revoke_key(
    key_id: str = typer.Argument(..., help="The key's id (key_...), as `keys list` shows it."),
    as_json: bool = JsonOption,
) -> None:
    """Revoke a key: every replica refuses it within the key cache TTL."""
    key: ApiKey = with_store(lambda store: store.revoke_key(key_id, actor=Actor.command_line()))
    if as_json:
        print_json(key)
        return
    ttl = settings_or_exit().key_cache_ttl_s
    typer.echo(f"Revoked key {key.id} ({key.display}); every replica refuses it within {ttl:g} s.")


def usage(
    user: str = typer.Option(None, help="Only this user's keys (id or email)."),
    key: str = typer.Option(None, "--key", help="Only this key (key_...)."),
    start_date: datetime = typer.Option(
        None, formats=["%Y-%m-%d"], help="First UTC day (default: 29 days before the last)."
    ),
    end_date: datetime = typer.Option(
        None, formats=["%Y-%m-%d"], help="Last UTC day (default: today)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Usage per key, model type and UTC day: requests, prompt and completion tokens.

    Replicas write usage every SERVICEAI_USAGE_FLUSH_S seconds and when they stop.
    """
    start: date | None = start_date.date() if start_date else None
    end: date | None = end_date.date() if end_date else None
    report: UsageList = with_store(
        lambda store: store.usage(user=user, key_id=key, start=start, end=end)
    )
    if as_json:
        print_json(report)
        return
    rows = [
        [
            str(r.date),
            r.user_id,
            r.key_id,
            r.model,
            str(r.requests),
            str(r.prompt_tokens),
            str(r.completion_tokens),
            str(r.total_tokens),
        ]
        for r in report.data
    ]
    table(["DATE", "USER", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL"], rows)
    totals = [
        sum(getattr(r, f) for r in report.data)
        for f in ("requests", "prompt_tokens", "completion_tokens", "total_tokens")
    ]
    typer.echo(
        f"{report.start_date} to {report.end_date}: {totals[0]} requests, {totals[1]} prompt + "
        f"{totals[2]} completion = {totals[3]} tokens."
    )
    if report.budget is not None:
        budget = report.budget
        typer.echo(
            f"Monthly budget ({budget.month}, UTC): {budget.used} of {budget.monthly_tokens} "
            f"tokens used, {budget.left} left."
        )


def audit(
    limit: int = typer.Option(50, min=1, max=1000, help="At most this many, newest first."),
    before: int = typer.Option(None, min=1, max=LAST_ID, help="Start before this entry id."),
    as_json: bool = JsonOption,
) -> None:
    """The audit log: every operator action (console, CLI, admin API), newest first."""
    page: AuditPage = with_store(lambda store: store.audit_log(limit=limit, before=before))
    if as_json:
        print_json(page)
        return
    table(
        ["ID", "AT (UTC)", "SOURCE", "ACTOR", "ACTION", "TARGET", "DETAIL"],
        [
            [str(e.id), when(e.at), e.source, e.actor, e.action, e.target, e.detail or "-"]
            for e in page.data
        ],
    )
    if page.has_more:
        typer.echo(f"... more: --before {page.data[-1].id}")
