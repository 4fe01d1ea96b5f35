"""The `serve run` that `serviceai run` starts, and everything of it that must stop with it.

`serve run` starts a local Ray cluster; Ray's workers start HAProxy and the vLLM engines.
When `serve run` ends without its own clean-up (SIGKILL, a crash), Ray's daemons follow it,
but HAProxy (a grandchild of a worker, in its own process group) would keep the HTTP port.
So `serviceai run` makes itself the subreaper of the whole tree: whatever of it is left once
`serve run` has ended is re-parented to `serviceai run`, which stops it before exiting.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# After SIGTERM or SIGKILL, how long a process may take to go away.
TERM_GRACE_S = 10.0
POLL_S = 0.2


class PortRefused(Exception):
    """The port is held by something this run cannot prove to be its own leftover."""


@dataclass(frozen=True)
class Process:
    """One process as /proc shows it; (pid, start) tells it from a later one reusing the pid."""

    pid: int
    ppid: int
    pgid: int
    state: str
    start: int
    argv: tuple[str, ...]

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def read_process(pid: int) -> Process | None:
    """The process `pid`, or None if there is none (or it vanished while being read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    return Process(
        pid=pid,
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        state=fields[0],
        start=int(fields[19]),
        argv=tuple(a.decode(errors="replace") for a in argv if a),
    )


def process_table() -> list[Process]:
    found = (read_process(int(name)) for name in os.listdir("/proc") if name.isdigit())
    return [p for p in found if p is not None]


def descendants(pid: int, table: list[Process]) -> list[Process]:
    """Every process below `pid` in the process tree."""
    children: dict[int, list[Process]] = {}
    for process in table:
        children.setdefault(process.ppid, []).append(process)
    found: list[Process] = []
    parents = [pid]
    while parents:
        below = children.get(parents.pop(), [])
        found += below
        parents += [p.pid for p in below]
    return found


def haproxies_of(runtime_dir: Path, table: list[Process]) -> list[Process]:
    """HAProxy processes whose config file lies in `runtime_dir`.

    Ray Serve starts HAProxy as `haproxy -db -f CONFIG` and writes no pid file; CONFIG is
    RAY_SERVE_HAPROXY_CONFIG_FILE_LOC (in the runtime folder) under a per-node folder.
    """
    found = []
    for process in table:
        argv = process.argv
        if not argv or Path(argv[0]).name != "haproxy" or "-f" not in argv[:-1]:
            continue
        config = Path(argv[argv.index("-f") + 1])
        if config.is_absolute() and config.is_relative_to(runtime_dir):
            found.append(process)
    return found


def listeners_on(port: int, table: list[Process]) -> list[Process]:
    """The processes (of those this user may inspect) holding a listening TCP socket on `port`."""
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(name).read_text().splitlines()[1:]:
                fields = line.split()
                # local address "ADDR:PORT" in hex; state 0A is LISTEN.
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    inodes.add(f"socket:[{fields[9]}]")
    holders = []
    for process in table:
        with contextlib.suppress(OSError):
            fds = os.scandir(f"/proc/{process.pid}/fd")
            if any(_readlink(fd.path) in inodes for fd in fds):
                holders.append(process)
    return holders


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def is_gone(process: Process) -> bool:
    """True once `process` has exited (a zombie counts: it holds nothing)."""
    now = read_process(process.pid)
    if now is None or now.start != process.start:
        return True
    if now.state == "Z":
        if now.ppid == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(now.pid, os.WNOHANG)
        return True
    return False


def stop_processes(
    processes: list[Process],
    grace_s: float = TERM_GRACE_S,
    echo: Callable[[str], None] = lambda line: None,
) -> list[Process]:
    """SIGTERM, then after `grace_s` SIGKILL; the processes still there after both."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, TERM_GRACE_S)):
        processes = [p for p in processes if not is_gone(p)]
        if processes and sig == signal.SIGKILL:
            echo(
                f"Killing {len(processes)} process(es) still there {grace_s:.0f} s after "
                "SIGTERM: " + ", ".join(f"{p.pid} ({_short(p)})" for p in processes)
            )
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)
        deadline = time.monotonic() + wait_s
        while processes and time.monotonic() < deadline:
            time.sleep(POLL_S)
            processes = [p for p in processes if not is_gone(p)]
        if not processes:
            break
    return processes


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def restore_default_signals() -> None:
    """Run in the child before exec: the stop signals act as they do by default.

    A background job of a non-interactive shell starts with SIGINT ignored, and an ignored
    signal stays ignored across exec: `serve run` would then never see the SIGINT that asks
    it to shut Serve down.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def _child_setup(parent: int) -> Callable[[], None]:
    def setup() -> None:
        restore_default_signals()
        # If `serviceai run` is killed outright, `serve run` still gets its SIGINT.
        _prctl(PR_SET_PDEATHSIG, signal.SIGINT)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGINT)

    return setup


@contextlib.contextmanager
def claim_runtime_dir(runtime_dir: Path, port: int) -> Iterator[None]:
    """Hold `runtime_dir` (one per port) for the lifetime of this run.

    While held, anything in that folder that still runs is a leftover of an earlier run.
    """
    runtime_dir.mkdir(parents=True, exist_ok=True)
    with open(runtime_dir / "serviceai-run.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise PortRefused(
                f"Another `serviceai run` (pid {holder}) serves port {port}; "
                f"stop it first (kill {holder}) or start this one with --port."
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def clear_port(runtime_dir: Path, host: str, port: int, echo: Callable[[str], None]) -> None:
    """Stop HAProxy processes an earlier run left in `runtime_dir`; refuse if the port is
    still held by anything else. Call it inside `claim_runtime_dir`."""
    stale = haproxies_of(runtime_dir, process_table())
    for process in stale:
        echo(f"Stopping HAProxy left by an earlier run: pid {process.pid} ({process.command})")
    if stop_processes(stale, echo=echo):
        raise PortRefused(f"Could not stop the HAProxy left by an earlier run on port {port}.")
    if port_is_free(host, port):
        return
    holders = listeners_on(port, process_table())
    if not holders:
        raise PortRefused(
            f"Port {port} is in use by a process this user cannot see; free it or use --port."
        )
    named = "; ".join(f"pid {p.pid}: {p.command}" for p in holders)
    pids = " ".join(str(p.pid) for p in holders)
    raise PortRefused(
        f"Port {port} is in use by another program ({named}). "
        f"Stop it (kill {pids}) or start on another port with --port."
    )


class ServeRun:
    """`serve run` as a child that stops on request, escalating if it does not."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        runtime_dir: Path,
        stop_grace_s: float,
        echo: Callable[[str], None],
        output: Path | None = None,
    ) -> None:
        """`output`: the file that `serve run`'s output (Ray's and Serve's logs) is appended
        to; None: this process's own stdout and stderr."""
        self.command = command
        self.output = output
        self.env = env
        self.runtime_dir = runtime_dir
        self.stop_grace_s = stop_grace_s
        self.echo = echo
        self.process: subprocess.Popen | None = None
        self.stop_requested_by: str | None = None
        self.failed = False

    def start(self) -> None:
        # Orphans of the tree below come to this process, not to init: it can stop them.
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        # Its own process group: a group-wide signal to ours reaches `serve run` only through
        # us, as one orderly stop, not as a simultaneous kill of it and its Ray daemons.
        log = None if self.output is None else self.output.open("ab")
        try:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                process_group=0,
                preexec_fn=_child_setup(os.getpid()),
                stdout=log,
                stderr=None if log is None else subprocess.STDOUT,
            )
        finally:
            if log is not None:
                log.close()  # the child holds its own copy

    def _on_signal(self, signum: int, frame: object) -> None:
        self.request_stop(signal.Signals(signum).name)

    def request_stop(self, reason: str, failed: bool = False) -> None:
        """Ask `serve run` to stop; `failed`: the stop is this run's own failure (exit 1)."""
        if self.stop_requested_by is None:
            self.stop_requested_by, self.failed = reason, failed

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self) -> int:
        """Until `serve run` has ended and nothing of it is left; this run's exit code:
        0 after a requested stop, 1 when the service failed to start, died, or left a process."""
        assert self.process is not None
        escalations = [
            ("sending it SIGTERM", lambda pid: os.kill(pid, signal.SIGTERM), TERM_GRACE_S),
            ("killing its process group", lambda pid: os.killpg(pid, signal.SIGKILL), TERM_GRACE_S),
        ]
        asked_at: float | None = None
        next_step_at: float | None = None
        while self.process.poll() is None:
            now = time.monotonic()
            if self.stop_requested_by is not None and asked_at is None:
                self.echo(f"Stopping ServiceAi ({self.stop_requested_by}) ...")
                self.process.send_signal(signal.SIGINT)
                asked_at, next_step_at = now, now + self.stop_grace_s
            elif (
                asked_at is not None
                and next_step_at is not None
                and now > next_step_at
                and escalations
            ):
                what, send, wait_s = escalations.pop(0)
                self.echo(f"serve run has not stopped {now - asked_at:.0f} s after SIGINT: {what}.")
                with contextlib.suppress(ProcessLookupError):
                    send(self.process.pid)
                next_step_at = now + wait_s
            self._reap_orphans()
            time.sleep(POLL_S if asked_at is not None else 1.0)
        if self.stop_requested_by is None:
            self.echo(f"serve run exited unexpectedly ({_describe(self.process.returncode)}).")
        left = self.stop_leftovers()
        return 0 if self.stop_requested_by is not None and not self.failed and not left else 1

    def stop_leftovers(self) -> list[Process]:
        """Stop every process `serve run` left (our whole subtree, and its HAProxy)."""
        table = process_table()
        own = descendants(os.getpid(), table)
        left = [p for p in own if p.state != "Z"]
        left += [p for p in haproxies_of(self.runtime_dir, table) if p not in own]
        if left:
            self.echo(
                f"Stopping {len(left)} process(es) serve run left: "
                + ", ".join(f"{p.pid} ({_short(p)})" for p in left)
            )
        remaining = stop_processes(left, echo=self.echo)
        self._reap_orphans()
        for process in remaining:
            self.echo(f"Could not stop pid {process.pid}: {process.command}")
        return remaining

    def _reap_orphans(self) -> None:
        """Orphans re-parented to us become zombies when they exit: reap them."""
        assert self.process is not None
        for process in process_table():
            zombie = process.ppid == os.getpid() and process.state == "Z"
            if zombie and process.pid != self.process.pid:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(process.pid, os.WNOHANG)


def _short(process: Process, width: int = 60) -> str:
    argv = process.argv or ("?",)
    command = shlex.join([Path(argv[0]).name, *argv[1:]])
    return command if len(command) <= width else command[: width - 3] + "..."


def _describe(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"
