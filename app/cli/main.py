"""The `serviceai` command: run the service locally, manage accounts and keys."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import typer
import yaml

from app.accounts.keystore import KeyStore
from app.accounts.keystore.errors import UserNotFound
from app.cli.adapters import adapters
from app.cli.common import EXIT_CODES, with_store
from app.cli.gpu_profile import gpu_profile
from app.cli.keys import keys
from app.cli.progress import StartProgress, last_lines, readiness
from app.cli.reports import audit, usage
from app.cli.serve_process import PortRefused, ServeRun, claim_runtime_dir, clear_port
from app.cli.users import users
from app.config.settings import PROJECT_ROOT
from app.serving.ray_runtime import cluster_env, free_port
from app.version import VERSION

cli = typer.Typer(help="ServiceAi: OpenAI-compatible chat completions on Ray Serve and vLLM.")
cli.add_typer(users, name="users")
cli.add_typer(keys, name="keys")
cli.add_typer(adapters, name="adapters")
cli.command("usage", epilog=EXIT_CODES)(usage)
cli.command("audit", epilog=EXIT_CODES)(audit)
cli.command("gpu-profile", epilog="Exit codes: 0 written, 2 what does not fit (named).")(
    gpu_profile
)

LOCAL_USER = "local@localhost"


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"serviceai {VERSION}")
        raise typer.Exit()


@cli.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """ServiceAi command line."""


@cli.command(epilog="Exit codes: 0 stopped on request, 1 failed to start or died, 2 port refused.")
def run(
    config: Path = typer.Option(PROJECT_ROOT / "serve_config.yaml", help="Serve config file."),
    host: str | None = typer.Option(None, help="Listen address (default: the config's)."),
    port: int | None = typer.Option(None, help="Listen port (default: the config's)."),
    ready_timeout_s: float = typer.Option(
        600, help="How long the service may take to start; then it is stopped (exit code 1)."
    ),
    stop_grace_s: float = typer.Option(
        60,
        help="After SIGTERM/SIGINT/SIGHUP, how long Serve may take to shut down before "
        "serve run is killed.",
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Print Ray's and Serve's log here instead of to a file."
    ),
) -> None:
    """Start the service with `serve run CONFIG` and say how to call it once it answers.

    While it starts it says when each model type is loading and ready; Ray's and Serve's own
    log goes to a file it names (or here, with --verbose), whose last lines it prints if the
    start fails. On the first start (an empty key store) it creates the user local@localhost
    and a key, and prints that key once. SIGTERM, SIGINT (Ctrl-C) or SIGHUP stops the service and
    everything it started (Ray, the engines, HAProxy), however this command was started.
    """
    http = yaml.safe_load(config.read_text()).get("http_options") or {}
    host = host or http.get("host", "127.0.0.1")
    port = port or http.get("port", 8000)
    # HAProxy's files and ports of this cluster, apart from any other on this machine.
    runtime_dir = Path(tempfile.gettempdir()) / f"sai-h-{port}"
    runtime = cluster_env(runtime_dir, free_port)
    try:
        with claim_runtime_dir(runtime_dir, port):
            clear_port(runtime_dir, host, port, typer.echo)
            first_key, owner = with_store(_first_start_key)
            log = None if verbose else runtime_dir / "serve-run.log"
            typer.echo(
                f"Starting ServiceAi from {config} on {host}:{port}: Ray, then the ingress, "
                "then each model type's engine (the first start takes a few minutes)."
            )
            if log is not None:
                log.write_bytes(b"")
                typer.echo(f"Ray's and Serve's log: {log} (--verbose prints it here)")
            if (host, port) != (http.get("host"), http.get("port")):
                config = _with_http_options(config, runtime_dir, host, port)
            # `--address local`: its own Ray cluster, never one found on the machine.
            serve = ServeRun(
                [
                    str(Path(sys.executable).with_name("serve")),
                    "run",
                    "--address",
                    "local",
                    str(config),
                ],
                {**_public_base_url(host, port), **os.environ, **runtime},
                runtime_dir,
                stop_grace_s,
                typer.echo,
                output=log,
            )
            serve.start()
            try:
                if _wait_ready(f"http://{host}:{port}", serve, ready_timeout_s):
                    _banner(f"http://{host}:{port}/v1", first_key, owner)
                elif log is not None and (serve.failed or not serve.running):
                    _show_log_tail(log)
            finally:
                code = serve.wait()
    except PortRefused as exc:
        typer.echo(str(exc), err=True)
        code = 2
    sys.exit(code)


def _with_http_options(config: Path, runtime_dir: Path, host: str, port: int) -> Path:
    """A copy of `config` that listens on host:port (Serve reads them from the file only)."""
    content = yaml.safe_load(config.read_text())
    content["http_options"] = {**(content.get("http_options") or {}), "host": host, "port": port}
    copy = runtime_dir / "serve_config.yaml"
    copy.write_text(yaml.safe_dump(content, sort_keys=False))
    return copy


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


def _public_base_url(host: str, port: int) -> dict[str, str]:
    """The console's quick-start names the address this run listens on, unless
    SERVICEAI_PUBLIC_BASE_URL says otherwise."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return {"SERVICEAI_PUBLIC_BASE_URL": f"http://{shown}:{port}/v1"}


def _wait_ready(origin: str, serve: ServeRun, timeout_s: float) -> bool:
    """True once every model type can serve (GET /ready), saying as each type loads and is
    ready; False if serve run exits, a stop is asked for, or the time is up (then it asks for
    a stop itself)."""
    deadline = time.monotonic() + timeout_s
    progress = StartProgress(typer.echo)
    while serve.running and serve.stop_requested_by is None:
        if time.monotonic() > deadline:
            typer.echo(f"The service was not ready within {timeout_s:.0f} s.", err=True)
            serve.request_stop("not ready in time", failed=True)
            return False
        ready, states = readiness(origin)
        progress.seen(states)
        if ready:
            return True
        time.sleep(2)
    return False


def _show_log_tail(log: Path) -> None:
    """The end of Ray's and Serve's log, where a failed start says why."""
    lines = last_lines(log)
    if lines:
        typer.echo(f"The last lines of {log}:", err=True)
        typer.echo("\n".join(f"  {line}" for line in lines), err=True)


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
Press Ctrl-C (or send SIGTERM to this process) to stop.
"""
    )


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
