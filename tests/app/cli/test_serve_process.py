"""How `serviceai run` supervises `serve run`: signals, escalation, leftovers, a stale HAProxy.

Real processes throughout: a small stand-in for `serve run` (this layer only starts a command,
signals it and stops what it leaves), and the HAProxy binary Ray Serve runs. The real
`serviceai run` with Ray and vLLM is in tests/e2e/test_run_stop.py.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.cli.serve_process import (
    PortRefused,
    claim_runtime_dir,
    clear_port,
    haproxies_of,
    process_table,
    read_process,
)
from tests.conftest import PROJECT_ROOT, free_port

# Stands in for `serve run`: reports its ignored signals, leaves a detached process behind (as
# Ray's worker leaves HAProxy), then waits; "stubborn" ignores the stop signals as well.
FAKE_SERVE_RUN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    report, mode = sys.argv[1], sys.argv[2]
    status = open("/proc/self/status").read().splitlines()
    ignored = next(line.split()[1] for line in status if line.startswith("SigIgn:"))
    detached = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                start_new_session=True)
    if mode == "stubborn":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(report + ".tmp", "w") as f:
        f.write(f"{ignored} {detached.pid}")
    os.rename(report + ".tmp", report)
    time.sleep(600)
""")

SUPERVISOR = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from app.cli.serve_process import ServeRun
    fake, report, mode, runtime = sys.argv[1:]
    run = ServeRun([sys.executable, fake, report, mode], dict(os.environ), Path(runtime),
                   stop_grace_s=1, echo=lambda line: print(line, flush=True))
    run.start()
    sys.exit(run.wait())
""")


def ignored_signals(mask_hex: str) -> set[signal.Signals]:
    mask = int(mask_hex, 16)
    return {s for s in signal.Signals if s < 64 and mask & (1 << (s - 1))}


def wait_for(condition, timeout_s: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return result


class Supervised:
    """The supervisor started as a background job of a non-interactive shell (SIGINT ignored)."""

    def __init__(self, tmp_path: Path, mode: str) -> None:
        fake, supervisor = tmp_path / "fake_serve.py", tmp_path / "supervisor.py"
        fake.write_text(FAKE_SERVE_RUN)
        supervisor.write_text(SUPERVISOR)
        self.report, self.log = tmp_path / "report", tmp_path / "log"
        self.job_status = tmp_path / "job-status"
        args = " ".join(
            [sys.executable, str(supervisor), str(fake), str(self.report), mode, str(tmp_path)]
        )
        self.shell = subprocess.Popen(
            [
                "bash",
                "-c",
                f"grep ^SigIgn: /proc/self/status > {self.job_status} & "
                f"{args} > {self.log} 2>&1 & echo $!; wait $!; echo $?",
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=PROJECT_ROOT,
            start_new_session=True,
        )
        self.pid = int(self.shell.stdout.readline())
        wait_for(self.report.exists, what="the stand-in serve run")
        child_ignores, detached = self.report.read_text().split()
        self.child_ignores = ignored_signals(child_ignores)
        self.detached = read_process(int(detached))
        self.child = next(p for p in process_table() if p.ppid == self.pid)

    def job_ignores(self) -> set[signal.Signals]:
        """What any background job of that shell starts with (Python then keeps it)."""
        return ignored_signals(self.job_status.read_text().split()[1])

    def exit_code(self) -> int:
        out, _ = self.shell.communicate(timeout=60)
        return int(out.strip())

    def gone(self, process) -> bool:
        now = read_process(process.pid)
        return now is None or now.start != process.start or now.state == "Z"

    def end(self) -> None:
        """After a failed test: stop what it started."""
        if self.shell.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.shell.wait()
        for process in (self.child, self.detached):
            if not self.gone(process):
                os.kill(process.pid, signal.SIGKILL)


@pytest.fixture
def supervised(tmp_path):
    started = []

    def start(mode: str) -> Supervised:
        started.append(Supervised(tmp_path, mode))
        return started[-1]

    yield start
    for run in started:
        run.end()


def test_a_background_job_stops_on_sigterm_and_leaves_nothing(supervised):
    run = supervised("normal")
    assert signal.SIGINT in run.job_ignores()
    assert not run.child_ignores & {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    assert run.child.pgid == run.child.pid  # its own group: a group signal reaches it through us
    assert not run.gone(run.detached)
    subprocess.run(["kill", "-TERM", str(run.pid)], check=True)
    assert run.exit_code() == 0
    assert run.gone(run.detached) and run.gone(run.child)
    assert "Stopping ServiceAi (SIGTERM)" in run.log.read_text()


def test_a_serve_run_that_ignores_the_stop_is_killed_after_the_grace_period(supervised):
    run = supervised("stubborn")
    subprocess.run(["kill", "-HUP", str(run.pid)], check=True)
    assert run.exit_code() == 0
    log = run.log.read_text()
    assert "has not stopped 1 s after SIGINT: sending it SIGTERM" in log
    assert "killing its process group" in log
    assert run.gone(run.detached) and run.gone(run.child)


def test_a_dead_serve_run_takes_what_it_left_with_it_and_exits_1(supervised):
    run = supervised("normal")
    subprocess.run(["kill", "-KILL", str(run.child.pid)], check=True)
    assert run.exit_code() == 1
    assert "serve run exited unexpectedly (killed by SIGKILL)" in run.log.read_text()
    assert run.gone(run.detached)


def port_held(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_haproxy(config_dir: Path, port: int) -> subprocess.Popen:
    """Ray Serve's HAProxy binary, started the way Ray starts it: `haproxy -db -f CONFIG`."""
    from ray.serve._private.haproxy import get_haproxy_binary

    config_dir.mkdir(parents=True)
    config = config_dir / "haproxy.cfg"
    config.write_text(
        textwrap.dedent(f"""
        defaults
            mode http
            timeout connect 1s
            timeout client 1s
            timeout server 1s
        frontend web
            bind 127.0.0.1:{port}
            http-request return status 200
    """)
    )
    haproxy = subprocess.Popen(
        [get_haproxy_binary(), "-db", "-f", str(config)], start_new_session=True
    )
    wait_for(lambda: port_held(port), what="HAProxy to listen")
    return haproxy


def test_a_start_stops_the_haproxy_an_earlier_run_left_in_its_runtime_folder(tmp_path):
    runtime, port = tmp_path / "rt", free_port()
    haproxy = start_haproxy(runtime / ("a" * 56), port)  # Ray's per-node folder
    assert [p.pid for p in haproxies_of(runtime, process_table())] == [haproxy.pid]
    said = []
    with claim_runtime_dir(runtime, port):
        clear_port(runtime, "127.0.0.1", port, said.append)
    assert haproxy.wait(timeout=5) is not None and not port_held(port)
    assert said == [
        f"Stopping HAProxy left by an earlier run: pid {haproxy.pid} ({get_command(haproxy)})"
    ]


def get_command(process: subprocess.Popen) -> str:
    return shlex.join(process.args)


def test_a_port_held_by_anything_else_is_refused_naming_it_and_left_alone(tmp_path):
    runtime, port = tmp_path / "rt", free_port()
    theirs = start_haproxy(tmp_path / "elsewhere", port)  # an HAProxy, but not of our folder
    try:
        assert haproxies_of(runtime, process_table()) == []
        with claim_runtime_dir(runtime, port), pytest.raises(PortRefused) as refused:
            clear_port(runtime, "127.0.0.1", port, print)
        message = str(refused.value)
        assert f"Port {port} is in use by another program (pid {theirs.pid}: " in message
        assert get_command(theirs) in message and f"kill {theirs.pid}" in message
        assert theirs.poll() is None and port_held(port)
    finally:
        theirs.kill()
        theirs.wait()


def test_a_second_run_on_the_same_port_is_refused_naming_the_first(tmp_path):
    runtime = tmp_path / "rt"
    with claim_runtime_dir(runtime, 8123):
        with pytest.raises(PortRefused, match=f"Another `serviceai run` \\(pid {os.getpid()}\\)"):
            with claim_runtime_dir(runtime, 8123):
                pass
    with claim_runtime_dir(runtime, 8123):
        pass
