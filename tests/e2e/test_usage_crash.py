"""Usage that survives a crash: an ingress replica killed with SIGKILL under load, its usage
counted in memory and not yet written; the replica Serve starts in its place replays the dead
one's journal, and every request that was answered is in the usage."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import psutil

from tests.conftest import Stack
from tests.e2e.processes import wait_until
from tests.e2e.test_limits import HI, ingress_app, new_user, usage_of

APP = "crash"


def ingress_pids() -> set[int]:
    """The live processes of the app's ingress replicas (Ray titles them ray::<actor class>)."""
    title = f"ray::ServeReplica:{APP}:Ingress"
    pids = set()
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if cmdline and cmdline[0].startswith(title) and process.info["status"] != "zombie":
            pids.add(process.pid)
    return pids


def test_a_killed_ingress_loses_none_of_the_usage_it_served(stack: Stack):
    _, key = new_user(stack, plan="pro")
    answered = sent = 0
    count = threading.Lock()
    stop = threading.Event()

    def client(base_url: str) -> None:
        nonlocal answered, sent
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
            while not stop.is_set():
                with count:
                    sent += 1
                try:
                    response = http.post(
                        f"{base_url}/chat/completions",
                        json={"model": "ServiceAi-Fast", "messages": HI, "max_tokens": 2},
                    )
                except httpx.HTTPError:
                    continue
                if response.status_code == 200:
                    with count:
                        answered += 1

    # An hour between writes: without the journal, all of it would be lost with the process.
    with ingress_app(stack, APP, env={"SERVICEAI_USAGE_FLUSH_S": "3600"}) as base_url:
        [pid] = ingress_pids()
        clients = [threading.Thread(target=client, args=(base_url,)) for _ in range(6)]
        for thread in clients:
            thread.start()
        try:
            wait_until(lambda: answered >= 60, timeout_s=60, interval_s=0.2)
            os.kill(pid, signal.SIGKILL)
            # Serve starts another replica; the clients keep going, and reach it.
            wait_until(lambda: ingress_pids() - {pid}, timeout_s=90, interval_s=0.5)
            served_before = answered
            wait_until(lambda: answered >= served_before + 10, timeout_s=60, interval_s=0.2)
        finally:
            stop.set()
            for thread in clients:
                thread.join()
    # The dead replica's usage, written by its successor at its start; the successor's own
    # at its stop.
    usage = usage_of(stack.base_url, key, answered, timeout_s=60)
    assert answered <= usage["requests"] <= sent, (answered, usage["requests"], sent)
