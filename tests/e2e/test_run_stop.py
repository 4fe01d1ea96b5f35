"""`serviceai run` stops, and leaves nothing running, however it was started and stopped.

Each test starts the real `serviceai run` (Ray Serve, vLLM, HAProxy) on the same free port,
so each start after the first also proves that the stop before it left the port usable.
The first uses the real serve_config.yaml; the others serve one model type of it, to keep
the suite's time down on two cores.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from app.cli.serve_process import (
    Process,
    descendants,
    haproxies_of,
    port_is_free,
    process_table,
    read_process,
)
from tests.conftest import SERVE_CONFIG, free_port

SERVICEAI = Path(sys.executable).with_name("serviceai")
READY_TIMEOUT_S = 400
# The default stop grace (60 s), then SIGTERM and SIGKILL (10 s each), then the leftovers.
STOPPED_TIMEOUT_S = 150


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def one_type_config(tmp_path_factory) -> Path:
    """serve_config.yaml serving its first model type only (plans and all else as they are)."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    args = config["applications"][0]["args"]
    args["model_types"] = args["model_types"][:1]
    path = tmp_path_factory.mktemp("config") / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(scope="module", autouse=True)
def runtime_dir(port: int, stack_lock: None):
    path = Path(tempfile.gettempdir()) / f"sai-h-{port}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Service:
    """One `serviceai run` started by this test, and how to tell its processes from others'.

    Every process of the run inherits RAY_TMPDIR=ray_dir (a folder of its own); Ray's daemons
    also name it on their command lines, and its HAProxy names its config in runtime_dir.
    """

    def __init__(
        self, tmp_path: Path, config: Path, port: int, runtime_dir: Path, background_job: bool
    ) -> None:
        self.port, self.runtime_dir = port, runtime_dir
        self.ray_dir = Path(tempfile.mkdtemp(prefix="sai-r-", dir="/tmp"))
        self.log = tmp_path / "serviceai-run.log"
        self.log.touch()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SERVICEAI_"))}
        env |= {
            "RAY_TMPDIR": str(self.ray_dir),
            "SERVICEAI_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}",
            "HF_HUB_OFFLINE": "1",
        }
        command = [str(SERVICEAI), "run", "--config", str(config), "--port", str(port)]
        if background_job:
            # As `make run > log 2>&1 &` in a script: the job starts with SIGINT ignored.
            script = f"{' '.join(command)} > {self.log} 2>&1 & echo $!; wait $!; echo $?"
            self.launcher = subprocess.Popen(
                ["bash", "-c", script],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            self.main = int(self.launcher.stdout.readline())
        else:
            # As a supervisor runs it: a direct child, leading its own process group.
            with open(self.log, "w") as log:
                self.launcher = subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            self.main = self.launcher.pid
        self.background_job = background_job
        self.seen: list[Process] = []

    def wait_ready(self) -> str:
        """Once every model type is ready: the API key the banner printed."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "ServiceAi is ready." not in self.log.read_text():
            assert self.launcher.poll() is None, f"serviceai run ended:\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"not ready:\n{self.log.read_text()[-3000:]}"
            time.sleep(1)
        return re.search(r"API key  : (\S+)", self.log.read_text())[1]

    def processes(self) -> list[Process]:
        """Every process of this run now: below serviceai run, or marked as this run's."""
        table = process_table()
        found = {p.pid: p for p in descendants(self.main, table)}
        found |= {p.pid: p for p in haproxies_of(self.runtime_dir, table)}
        for process in table:
            if process.pid not in found and self._marked(process):
                found[process.pid] = process
        return list(found.values())

    def _marked(self, process: Process) -> bool:
        if any(str(self.ray_dir) in arg for arg in process.argv):
            return True
        try:
            environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return f"RAY_TMPDIR={self.ray_dir}".encode() in environ

    def remember_processes(self) -> list[Process]:
        self.seen = self.processes()
        return self.seen

    def serve_run(self) -> Process:
        return next(
            p
            for p in self.seen
            if p.ppid == self.main
            and "run" in p.argv
            and Path(p.argv[1] if len(p.argv) > 1 else "").name == "serve"
        )

    def exit_code(self) -> int | None:
        if self.background_job:
            if self.launcher.poll() is None:
                return None
            return int(self.launcher.stdout.read().strip())
        return self.launcher.poll()

    def wait_stopped(self) -> int:
        """Bounded: serviceai run's exit code once it, and every process of the run, is gone."""
        began = time.monotonic()
        deadline = began + STOPPED_TIMEOUT_S
        while True:
            code = self.exit_code()
            alive = [p for p in self.seen if _alive(p)] + [
                p for p in self.processes() if p.state != "Z" and p.pid != self.main
            ]
            if code is not None and not alive and port_is_free("127.0.0.1", self.port):
                print(f"all of the run gone {time.monotonic() - began:.1f} s after the signal")
                return code
            assert time.monotonic() < deadline, (
                f"still running: exit code {code}, "
                f"{[(p.pid, p.command[:80]) for p in alive]}\n{self.log.read_text()[-3000:]}"
            )
            time.sleep(0.5)

    def end(self) -> None:
        """After a failed test: kill whatever of the run is left, so the next test can start."""
        for process in self.seen + self.processes():
            if _alive(process):
                os.kill(process.pid, signal.SIGKILL)
        if self.launcher.poll() is None:
            self.launcher.kill()
        self.launcher.wait()
        shutil.rmtree(self.ray_dir, ignore_errors=True)


def _alive(process: Process) -> bool:
    now = read_process(process.pid)
    return now is not None and now.start == process.start and now.state != "Z"


@pytest.fixture
def start(tmp_path, port, runtime_dir, stack):
    """Starts `serviceai run` beside the session's stack: a second Ray cluster on the machine,
    as `make run` beside a test session. Each start must answer with its own service (its own
    key store): Serve's fixed per-machine ports once sent one cluster's requests to the other."""
    started: list[Service] = []

    def run(config: Path, background_job: bool) -> Service:
        service = Service(tmp_path, config, port, runtime_dir, background_job)
        started.append(service)
        key = service.wait_ready()
        running = service.remember_processes()
        kinds = {_kind(p) for p in running}
        assert {"raylet", "gcs_server", "ServeReplica", "haproxy"} <= kinds, kinds
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": "ServiceAi-Fast",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        return service

    yield run
    for service in started:
        service.end()


def _kind(process: Process) -> str:
    name = process.argv[0] if process.argv else ""
    if name.startswith("ray::ServeReplica"):
        return "ServeReplica"
    return Path(name.split()[0]).name if name else ""


def test_sigterm_to_a_background_job_stops_everything(start):
    service = start(SERVE_CONFIG, background_job=True)
    # The start told each type's state as a person reads it; Ray's log went to its file.
    told = service.log.read_text()
    assert "the service answers; its model types:" in told
    types = yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0]["args"]["model_types"]
    for name in (t["name"] for t in types):
        assert re.search(rf"^ +\d+ s +{name} +ready$", told, re.M), told
    ray_log = service.runtime_dir / "serve-run.log"
    assert "Running config file" in ray_log.read_text() and "Running config file" not in told
    os.kill(service.main, signal.SIGTERM)
    assert service.wait_stopped() == 0
    assert "Stopping ServiceAi (SIGTERM)" in service.log.read_text()


def test_sigterm_to_the_process_group_of_a_supervised_run_stops_everything(start, one_type_config):
    service = start(one_type_config, background_job=False)
    os.killpg(service.main, signal.SIGTERM)
    assert service.wait_stopped() == 0


def test_a_killed_serve_run_takes_haproxy_and_ray_with_it(start, one_type_config):
    service = start(one_type_config, background_job=True)
    os.kill(service.serve_run().pid, signal.SIGKILL)
    assert service.wait_stopped() == 1
    log = service.log.read_text()
    assert "serve run exited unexpectedly (killed by SIGKILL)" in log
    # What the issue saw stay behind, holding the port, is gone (wait_stopped: every process of
    # the run, the port free): stopped by serviceai run where it outlived serve run, or first by
    # Ray's HAProxy manager as its raylet went down, which a loaded machine gives the time to do
    # (seen once in a full suite: the leftovers then named no HAProxy).
    haproxies = [p for p in service.seen if _kind(p) == "haproxy"]
    assert haproxies and not any(_alive(p) for p in haproxies)
    left = next((line for line in log.splitlines() if "serve run left:" in line), "")
    assert "haproxy" not in left or f"haproxy -db -f {service.runtime_dir}/" in left


def test_the_next_start_after_a_killed_serve_run_serves_and_stops_on_sigint(start, one_type_config):
    service = start(one_type_config, background_job=False)
    os.kill(service.main, signal.SIGINT)
    assert service.wait_stopped() == 0
