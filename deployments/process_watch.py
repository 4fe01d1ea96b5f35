"""Waiting for another process to end, without polling where the OS allows."""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Callable, Iterator, Sequence

import psutil

POLL_S = 0.25
"""How often a wait looks whether the processes still run where it cannot wait on them (no
pidfd: not Linux)."""
GIVE_UP_CHECK_S = 5.0
"""How often a wait on the processes' pidfds asks whether to give up."""


def first_to_end(pids: Sequence[int], give_up: Callable[[], bool]) -> bool:
    """Block until one of `pids` ends (True) or `give_up()` says to stop (False). On Linux the
    wait is on the processes' pidfds, as vLLM's monitor waits on its children's sentinels: the
    thread wakes only to ask `give_up` (every GIVE_UP_CHECK_S), so it neither costs the serving
    process CPU nor takes its GIL while the core runs (a poll every POLL_S did, ~4 us per
    token of a serving process at c=32: bench/NOTES.md). Elsewhere it polls. With no `pids`
    there is nothing left to wait for (True)."""
    if not pids:
        return True
    with contextlib.ExitStack() as opened:
        try:
            fds = [opened.enter_context(_pidfd(pid)) for pid in pids]
        except ProcessLookupError:
            return True  # ended already
        except (AttributeError, OSError):  # no pidfd_open here
            return _poll_until_one_ends(pids, give_up)
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        while not poller.poll(int(GIVE_UP_CHECK_S * 1000)):
            if give_up():
                return False
        return True


@contextlib.contextmanager
def _pidfd(pid: int) -> Iterator[int]:
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


def _poll_until_one_ends(pids: Sequence[int], give_up: Callable[[], bool]) -> bool:
    try:
        processes = [psutil.Process(pid) for pid in pids]
    except psutil.NoSuchProcess:
        return True
    while not psutil.wait_procs(processes, timeout=POLL_S)[0]:
        if give_up():
            return False
    return True
