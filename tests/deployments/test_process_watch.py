"""Waiting on another process's end: at once when it ends, without waking while it runs."""

import os
import subprocess
import sys
import threading
import time

from deployments import process_watch
from deployments.process_watch import first_to_end

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _wait_in_thread(pids, give_up):
    result = {}
    thread = threading.Thread(target=lambda: result.update(ended=first_to_end(pids, give_up)))
    thread.start()
    return thread, result


def test_the_wait_ends_the_moment_one_process_ends_and_asks_nothing_meanwhile():
    first, second = subprocess.Popen(SLEEPER), subprocess.Popen(SLEEPER)
    asked = []
    try:
        thread, result = _wait_in_thread([first.pid, second.pid], lambda: asked.append(1))
        thread.join(1.0)
        assert thread.is_alive() and not asked  # no wake-up while both run
        killed = time.monotonic()
        second.kill()
        thread.join(10)
        assert result == {"ended": True}
        assert time.monotonic() - killed < 1.0  # not at the next give-up check (5 s)
    finally:
        for process in (first, second):
            process.kill()
            process.wait()


def test_the_wait_gives_up_when_asked_and_a_gone_process_has_ended_already(monkeypatch):
    monkeypatch.setattr(process_watch, "GIVE_UP_CHECK_S", 0.05)
    sleeper = subprocess.Popen(SLEEPER)
    try:
        assert first_to_end([sleeper.pid], lambda: True) is False
    finally:
        sleeper.kill()
        sleeper.wait()
    assert first_to_end([sleeper.pid], lambda: False) is True  # reaped: no such process
    assert first_to_end([], lambda: False) is True


def test_without_pidfds_the_wait_polls(monkeypatch):
    monkeypatch.delattr(os, "pidfd_open")
    monkeypatch.setattr(process_watch, "POLL_S", 0.05)
    sleeper = subprocess.Popen(SLEEPER)
    try:
        assert first_to_end([sleeper.pid], lambda: True) is False
        thread, result = _wait_in_thread([sleeper.pid], lambda: False)
        sleeper.kill()
        thread.join(10)
        assert result == {"ended": True}
    finally:
        sleeper.kill()
        sleeper.wait()
