import os
import signal
import subprocess
import sys
import time
from importlib.metadata import entry_points

import psutil

GRANDCHILD = (
    "import time; from deployments.vllm_engine.lifetime import exit_with_parent; "
    "exit_with_parent(); print('armed', flush=True); time.sleep(60)"
)
PARENT = (
    "import subprocess, sys, time; "
    f"p = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}]); "
    "print(p.pid, flush=True); time.sleep(60)"
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_process_exits_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    grandchild = int(parent.stdout.readline())
    # The grandchild writes to the same pipe once armed; a loaded machine may take seconds.
    assert parent.stdout.readline().strip() == "armed"
    assert not gone(grandchild)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while not gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(grandchild)


def test_registered_as_a_vllm_general_plugin():
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert (
        plugins["serviceai_exit_with_parent"] == "deployments.vllm_engine.lifetime:exit_with_parent"
    )
