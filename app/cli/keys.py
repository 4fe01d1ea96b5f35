"""`serviceai keys ...`: API keys: create (shown once), list, scope, rotate, revoke."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import typer

from app.accounts.keystore import KeyStore
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.schemas import (
    DEFAULT_GRACE_S,
    ApiKey,
    ApiKeyCreate,
    ApiKeyRotate,
    ApiKeyUpdate,
)
from app.cli.common import (
    EXIT_CODES,
    EXIT_USAGE,
    JsonOption,
    LimitOption,
    ListOrder,
    OrderOption,
    fail,
    print_issued,
    print_json,
    settings_or_exit,
    table,
    validated,
    when,
    with_store,
)

KeyArgument = typer.Argument(..., help="The key's id (key_...), as `keys list` shows it.")
keys = typer.Typer(
    help="API keys: create (shown once), list, scope, rotate, revoke.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)

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
ManageKeysOption = typer.Option(
    None,
    "--manage-keys/--no-manage-keys",
    help="Whether it may create, change, rotate and revoke its user's keys through the "
    "account API (a new key may unless --no-manage-keys).",
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
        f"; manages keys: {'yes' if key.manage_keys else 'no'}"
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
    manage_keys: bool | None = ManageKeysOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a key, scoped if asked, and print it once (the store keeps only its hash)."""
    limits: dict[str, int | None] = dict(
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        concurrent_requests=concurrent_requests,
        tokens_per_day=tokens_per_day,
    )
    body = validated(
        ApiKeyCreate,
        name=name,
        **scope_fields(models, expires_in, expires_at, limits, monthly_tokens),
        **({} if manage_keys is None else {"manage_keys": manage_keys}),
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
    key_id: str = KeyArgument,
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
    manage_keys: bool | None = ManageKeysOption,
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
    if manage_keys is not None:
        fields["manage_keys"] = manage_keys
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
    key_id: str = KeyArgument,
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
    limit: int = LimitOption,
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
    key_id: str = KeyArgument,
    as_json: bool = JsonOption,
) -> None:
    """Revoke a key: every replica refuses it within the key cache TTL."""
    key: ApiKey = with_store(lambda store: store.revoke_key(key_id, actor=Actor.command_line()))
    if as_json:
        print_json(key)
        return
    ttl = settings_or_exit().key_cache_ttl_s
    typer.echo(f"Revoked key {key.id} ({key.display}); every replica refuses it within {ttl:g} s.")
