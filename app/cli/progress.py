"""What `serviceai run` says while the service starts: each model type loading, then ready,
read from the service's own /ready, instead of Ray's and Serve's log (kept in a file, whose last
lines are shown if the start fails)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path

STATES = {
    "unknown": "waiting for Serve to report it",
    "pending": "loading its model",
    "ready": "ready",
    "unavailable": "lost its replicas; Serve starts new ones",
}
"""/ready's words for a type's state (app.serving.dispatch, `readiness`) as a person reads them."""


def readiness(origin: str) -> tuple[bool, dict[str, str] | None]:
    """Whether every type can serve, and each type's state; (False, None) while nothing answers
    at `origin` yet (Ray, the proxy or the ingress still starting)."""
    try:
        with urllib.request.urlopen(f"{origin}/ready", timeout=2) as response:
            return response.status == 200, json.load(response).get("model_types")
    except urllib.error.HTTPError as answered:  # 503 until every type can serve
        try:
            return False, json.load(answered).get("model_types")
        except ValueError:
            return False, None
    except (OSError, ValueError):
        return False, None


class StartProgress:
    """Prints a line when the service first answers and whenever a type's state changes."""

    def __init__(self, echo: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.echo = echo
        self.clock = clock
        self.started_at = clock()
        self.states: dict[str, str] | None = None

    def seen(self, states: dict[str, str] | None) -> None:
        if states is None:
            return
        elapsed = f"{self.clock() - self.started_at:4.0f} s"
        if self.states is None:
            self.echo(f"{elapsed}  the service answers; its model types:")
        for name, state in states.items():
            if self.states is None or self.states.get(name) != state:
                self.echo(f"{elapsed}    {name:18} {STATES.get(state, state)}")
        self.states = dict(states)


def last_lines(path: Path, count: int = 40) -> list[str]:
    """The file's last `count` lines (none if it is not there)."""
    try:
        with path.open(errors="replace") as lines:
            return [line.rstrip("\n") for line in deque(lines, maxlen=count)]
    except FileNotFoundError:
        return []
