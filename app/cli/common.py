"""What the account commands share: the store they open, their exit codes, tables and JSON.

Every command opens the store named by SERVICEAI_DATABASE_URL (upgrading its schema), prints a
table or, with --json, the same JSON the admin API returns. Exit codes: 0 done, 1 refused (not
found, already exists, limit), 2 bad usage or configuration, 3 key store unreachable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import NoReturn, TypeVar

import typer
from pydantic import BaseModel, ValidationError

from app.accounts.keystore import KeyStore, open_store
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.schemas import IssuedApiKey
from app.config.settings import Settings, get_settings

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3

EXIT_CODES = (
    "Store: SERVICEAI_DATABASE_URL. Exit codes: 0 done, 1 refused (not found, exists, limit), "
    "2 bad usage or configuration, 3 key store unreachable."
)
JsonOption = typer.Option(False, "--json", help="Print JSON (as the admin API returns it).")


class ListOrder(StrEnum):
    asc = "asc"
    desc = "desc"


LimitOption = typer.Option(1000, min=1, max=1000, help="At most this many.")
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


def validated(schema: type[Model], /, **fields: object) -> Model:
    try:
        return schema.model_validate(fields)
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


def print_json(value: BaseModel) -> None:
    typer.echo(value.model_dump_json(indent=2))


def print_issued(key: IssuedApiKey) -> None:
    name = f' "{key.name}"' if key.name else ""
    typer.echo(f"Key {key.id}{name} ({key.display}) for {key.user_id}:\n\n    {key.key}\n")
    typer.echo("Copy it now: it is not shown again.")
