"""`serviceai users ...`: accounts: create, list, disable, enable, plan, role, budget, password."""

from __future__ import annotations

import sys

import typer
from pydantic import BaseModel

from app.accounts.keystore import KeyStore
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.schemas import (
    DEFAULT_PLAN,
    ApiKeyCreate,
    IssuedApiKey,
    PasswordSet,
    User,
    UserCreate,
    UserUpdate,
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
    table,
    validated,
    when,
    with_store,
)

UserArgument = typer.Argument(..., help="User id or email.")
users = typer.Typer(
    help="Accounts: create, list, disable, enable, change plan, set a console password.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)


class UserWithKey(BaseModel):
    """`users create --with-key --json`: the user and their first key (with its secret)."""

    user: User
    key: IssuedApiKey


def print_user(user: User) -> None:
    status = "disabled" if user.disabled else "active"
    operator = ", an operator" if user.role == "admin" else ""
    typer.echo(f"User {user.id}: {user.email}, plan {user.plan}, {status}{operator}.")


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
    limit: int = LimitOption,
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
    user: str = UserArgument,
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
def disable_user(user: str = UserArgument, as_json: bool = JsonOption) -> None:
    """Disable a user: all their keys stop working (within the key cache TTL)."""
    _update(user, as_json, disabled=True)


@users.command("enable")
def enable_user(user: str = UserArgument, as_json: bool = JsonOption) -> None:
    """Enable a disabled user again: their keys that are not revoked work again."""
    _update(user, as_json, disabled=False)


@users.command("set-plan")
def set_plan(
    user: str = UserArgument,
    plan: str = typer.Argument(..., help="The new plan."),
    as_json: bool = JsonOption,
) -> None:
    """Move a user to another plan."""
    _update(user, as_json, plan=plan)


@users.command("set-role")
def set_role(
    user: str = UserArgument,
    role: str = typer.Argument(..., help="admin (an operator of the console) or user."),
    as_json: bool = JsonOption,
) -> None:
    """Make a user an operator (admin) of the console, or take it back (user)."""
    _update(user, as_json, role=role)


@users.command("set-password")
def set_password(
    user: str = UserArgument,
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
