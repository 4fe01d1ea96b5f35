"""The `serviceai` command: run the service locally, manage accounts and keys."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import typer

from app.cli_accounts import EXIT_CODES, keys, usage, users, with_store
from app.keystore import KeyStore
from app.keystore.errors import UserNotFound
from app.serve_runtime import cluster_env
from app.settings import PROJECT_ROOT

cli = typer.Typer(help="ServiceAi: OpenAI-compatible chat completions on Ray Serve and vLLM.")
cli.add_typer(users, name="users")
cli.add_typer(keys, name="keys")
cli.command("usage", epilog=EXIT_CODES)(usage)

LOCAL_USER = "local@localhost"


@cli.callback()
def _root() -> None:
    """ServiceAi command line."""


@cli.command()
def run(
    config: Path = typer.Option(PROJECT_ROOT / "serve_config.yaml", help="Serve config file."),
    host: str = typer.Option("127.0.0.1", help="Address the service listens on (for the banner)."),
    port: int = typer.Option(8000, help="Port the service listens on (for the banner)."),
    ready_timeout_s: float = typer.Option(600, help="How long to wait for the first start."),
) -> None:
    """Start the service with `serve run CONFIG` and say how to call it once it answers.

    On the first start (an empty key store) it creates the user local@localhost and a key,
    and prints that key once.
    """
    first_key, owner = with_store(_first_start_key)
    serve_bin = Path(sys.executable).with_name("serve")
    typer.echo(f"Starting ServiceAi from {config} (first start takes a minute or two) ...")
    # HAProxy's files and ports of this cluster, apart from any other on this machine.
    runtime = cluster_env(
        Path(tempfile.gettempdir()) / f"sai-h-{port}", stats_port=_free_port(), metrics_port=_free_port()
    )
    process = subprocess.Popen([str(serve_bin), "run", str(config)], env={**os.environ, **runtime})

    def stop(signum: int, frame: object) -> None:
        process.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, stop)
    base_url = f"http://{host}:{port}/v1"
    try:
        if _wait_ready(f"http://{host}:{port}", process, ready_timeout_s):
            _banner(base_url, first_key, owner)
        sys.exit(process.wait())
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        sys.exit(process.wait())


async def _first_start_key(store: KeyStore) -> tuple[str | None, str]:
    """A new key for local@localhost when the store has no user yet; and whom to name in the
    banner's `keys create --user ...` otherwise."""
    if not (await store.list_users(limit=1)).data:
        user = await store.create_user(LOCAL_USER)
        return (await store.create_key(user.id, "local")).key, LOCAL_USER
    try:
        await store.get_user(LOCAL_USER)
    except UserNotFound:
        return None, "<your email>"
    return None, LOCAL_USER


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(origin: str, process: subprocess.Popen, timeout_s: float) -> bool:
    """True once every model type can serve (GET /ready); False if serve run exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{origin}/ready", timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(2)
    typer.echo(f"The service did not answer within {timeout_s:.0f} s; see the log above.", err=True)
    return False


def _serviceai_command() -> str:
    """How to call this very `serviceai` from the current folder (usually .venv/bin/serviceai)."""
    script = Path(sys.executable).with_name("serviceai")
    try:
        return shlex.quote(os.path.relpath(script))
    except ValueError:
        return shlex.quote(str(script))


def _banner(base_url: str, key: str | None, owner: str) -> None:
    if key is None:
        key_line = (
            "API key  : create one with\n"
            f"             {_serviceai_command()} keys create --user {owner}"
        )
        shown = "<your key>"
    else:
        key_line = f"API key  : {key}\n             (for {owner}; shown once: copy it now)"
        shown = key
    typer.echo(
        f"""
ServiceAi is ready.
  Base URL : {base_url}
  {key_line}

  from openai import OpenAI
  client = OpenAI(base_url="{base_url}", api_key="{shown}")
  print(client.chat.completions.create(model="ServiceAi-Fast",
        messages=[{{"role": "user", "content": "Hello"}}]).choices[0].message.content)

Manage users and keys: {_serviceai_command()} users --help, {_serviceai_command()} keys --help
Press Ctrl-C to stop.
"""
    )


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
