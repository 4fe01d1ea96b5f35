"""The `serviceai` command: run the service locally (and, later, manage accounts and keys)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import typer

from app.settings import PROJECT_ROOT

cli = typer.Typer(help="ServiceAi: OpenAI-compatible chat completions on Ray Serve and vLLM.")


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
    """Start the service with `serve run CONFIG` and say how to call it once it answers."""
    env = dict(os.environ)
    if not env.get("SERVICEAI_DEV_API_KEY"):
        env["SERVICEAI_DEV_API_KEY"] = "sai-dev-" + secrets.token_urlsafe(24)
    serve_bin = Path(sys.executable).with_name("serve")
    typer.echo(f"Starting ServiceAi from {config} (first start takes a minute or two) ...")
    process = subprocess.Popen([str(serve_bin), "run", str(config)], env=env)

    def stop(signum: int, frame: object) -> None:
        process.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, stop)
    base_url = f"http://{host}:{port}/v1"
    try:
        if _wait_ready(f"http://{host}:{port}", env["SERVICEAI_DEV_API_KEY"], process, ready_timeout_s):
            _banner(base_url, env["SERVICEAI_DEV_API_KEY"])
        sys.exit(process.wait())
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        sys.exit(process.wait())


def _wait_ready(origin: str, key: str, process: subprocess.Popen, timeout_s: float) -> bool:
    """True once every model type is listed and the ingress answers; False if serve run exits."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(f"{origin}/v1/models", headers={"Authorization": f"Bearer {key}"})
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(2)
    typer.echo(f"The service did not answer within {timeout_s:.0f} s; see the log above.", err=True)
    return False


def _banner(base_url: str, key: str) -> None:
    typer.echo(
        f"""
ServiceAi is ready.
  Base URL : {base_url}
  API key  : {key}   (development key of this run)

  from openai import OpenAI
  client = OpenAI(base_url="{base_url}", api_key="{key}")
  print(client.chat.completions.create(model="ServiceAi-Fast",
        messages=[{{"role": "user", "content": "Hello"}}]).choices[0].message.content)

Press Ctrl-C to stop.
"""
    )


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
