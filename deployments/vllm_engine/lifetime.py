"""Engine processes die with the replica that started them.

vLLM runs its engine core (and that core's workers) in child processes that do not watch
their parent. When Ray kills a replica (failed health check, node drain, `ray stop`), they
lived on as orphans holding their memory (on GPUs: the whole card). Registered as a vLLM
general plugin, this runs in every vLLM process and ends it once its parent is gone.
"""

from __future__ import annotations

import os
import signal
import threading
import time

POLL_S = 1.0


def exit_with_parent() -> None:
    """vLLM general plugin: start a daemon thread that kills this process when orphaned."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="serviceai-exit-with-parent", daemon=True).start()
