"""`serviceai adapters ...`: LoRA adapters registered on model types while the service runs:
add, list, remove. The store holds them; every ingress replica reads them within the key
cache TTL, and a model replica loads one from its path the first time a request names it."""

from __future__ import annotations

import typer

from app.accounts.keystore.audit import Actor
from app.accounts.keystore.schemas import Adapter, AdapterCreate, AdapterList
from app.cli.common import (
    EXIT_CODES,
    EXIT_USAGE,
    JsonOption,
    fail,
    print_json,
    settings_or_exit,
    table,
    validated,
    when,
    with_store,
)
from app.openai.errors import ApiError
from app.serving.adapters import check_adapter_path

adapters = typer.Typer(
    help="LoRA adapters registered at run time: add, list, remove (those of the config are "
    "listed by GET /v1/models).",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)
ModelArgument = typer.Argument(..., help="The model type it adapts, e.g. ServiceAi-Coder.")
NameArgument = typer.Argument(..., help="Its name: clients call it as MODEL:NAME.")


@adapters.command("add")
def add_adapter(
    model: str = ModelArgument,
    name: str = NameArgument,
    path: str = typer.Argument(
        ..., help="A folder in PEFT's format that every GPU node reads, or a Hugging Face id."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Register an adapter. The type's engine must take adapters (engine_args.enable_lora);
    the admin API checks that against its running replicas, this command cannot."""
    wanted = validated(AdapterCreate, model=model, name=name, path=path)
    settings = settings_or_exit()
    try:
        check_adapter_path(wanted.path, settings.adapter_roots, settings.adapter_hub_ids)
    except ApiError as refused:
        fail(refused.message, EXIT_USAGE)
    adapter: Adapter = with_store(
        lambda store: store.register_adapter(
            wanted.model, wanted.name, wanted.path, actor=Actor.command_line()
        )
    )
    if as_json:
        print_json(adapter)
        return
    ttl = settings.key_cache_ttl_s
    typer.echo(f"Registered {adapter.id} ({adapter.path}); callable within {ttl:g} s.")


@adapters.command("list")
def list_adapters(
    model: str = typer.Option(None, help="Only this model type's."),
    as_json: bool = JsonOption,
) -> None:
    """List the registered adapters."""
    listed = AdapterList(data=with_store(lambda store: store.adapters(model)))
    if as_json:
        print_json(listed)
        return
    table(
        ["ID", "PATH", "REGISTERED"],
        [[a.id, a.path, when(a.created_at)] for a in listed.data],
    )


@adapters.command("remove")
def remove_adapter(
    adapter_id: str = typer.Argument(..., help="MODEL:NAME, as clients call it."),
    as_json: bool = JsonOption,
) -> None:
    """Unregister an adapter: its callers get a 404 within the key cache TTL."""
    model_type, _, name = adapter_id.partition(":")
    adapter: Adapter = with_store(
        lambda store: store.remove_adapter(model_type, name, actor=Actor.command_line())
    )
    if as_json:
        print_json(adapter)
        return
    ttl = settings_or_exit().key_cache_ttl_s
    typer.echo(f"Removed {adapter.id}; every replica refuses it within {ttl:g} s.")
