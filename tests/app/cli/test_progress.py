"""`serviceai run`'s start, as a person reads it: a line when the service first answers and
one whenever a model type's state changes (from the service's own /ready), Ray's and Serve's log
in a file, and that file's last lines when the start fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from app.cli.progress import StartProgress, last_lines, readiness
from tests.conftest import free_port


def test_each_types_state_is_told_once_as_it_changes():
    lines: list[str] = []
    now = iter([0.0, 3.0, 9.0, 15.0, 42.0])
    progress = StartProgress(lines.append, clock=lambda: next(now))

    progress.seen(None)  # nothing answers yet: nothing to say
    progress.seen({"ServiceAi-Fast": "ready", "ServiceAi-Pro": "unknown"})
    progress.seen({"ServiceAi-Fast": "ready", "ServiceAi-Pro": "pending"})
    progress.seen({"ServiceAi-Fast": "ready", "ServiceAi-Pro": "pending"})
    progress.seen({"ServiceAi-Fast": "ready", "ServiceAi-Pro": "ready"})

    assert lines == [
        "   3 s  the service answers; its model types:",
        "   3 s    ServiceAi-Fast     ready",
        "   3 s    ServiceAi-Pro      waiting for Serve to report it",
        "   9 s    ServiceAi-Pro      loading its model",
        "  42 s    ServiceAi-Pro      ready",
    ]


def test_readiness_reads_the_503_and_the_200_and_nothing_where_nothing_listens():
    answers = [
        (503, {"status": "not_ready", "model_types": {"ServiceAi-Fast": "pending"}}),
        (200, {"status": "ready", "model_types": {"ServiceAi-Fast": "ready"}}),
    ]

    class Ready(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers.pop(0)
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert readiness(origin) == (False, {"ServiceAi-Fast": "pending"})
        assert readiness(origin) == (True, {"ServiceAi-Fast": "ready"})
    finally:
        server.shutdown()
    assert readiness(f"http://127.0.0.1:{free_port()}") == (False, None)


def test_serve_runs_output_goes_to_the_file_and_its_end_is_shown(tmp_path):
    log = tmp_path / "serve-run.log"
    supervisor = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from app.cli.serve_process import ServeRun
        child = "import sys; print('ray says hello', flush=True); print('it failed', file=sys.stderr)"
        run = ServeRun([sys.executable, "-c", child], {{}}, Path({str(tmp_path)!r}),
                       stop_grace_s=1, echo=lambda line: print(line, flush=True),
                       output=Path({str(log)!r}))
        run.start()
        sys.exit(run.wait())
    """)
    done = subprocess.run(
        [sys.executable, "-c", supervisor],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )

    assert "ray says hello" not in done.stdout + done.stderr  # in the file, not here
    assert "serve run exited unexpectedly" in done.stdout
    assert last_lines(log) == ["ray says hello", "it failed"]
    assert last_lines(log, count=1) == ["it failed"]
    assert last_lines(tmp_path / "absent.log") == []
