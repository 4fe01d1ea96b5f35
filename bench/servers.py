"""Start and stop the two servers the benchmark compares, on the same model and engine settings."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from app.accounts.keystore import open_store
from app.config.settings import Settings
from app.serving.ray_runtime import cluster_env, free_port
from deployments.model_type import DEPLOYMENT_ONLY, TINY_MODEL, ModelTypeConfig, tiny_model_dir
from deployments.tiny_model import ensure

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SERVE_CONFIG = PROJECT_ROOT / "serve_config.yaml"
BENCH_TYPE = "ServiceAi-Fast"
BENCH_LIMITS = {
    "requests_per_minute": 10**9,
    "tokens_per_minute": 10**12,
    "concurrent_requests": 10**6,
    "tokens_per_day": 10**15,
}
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Server:
    name: str
    base_url: str  # without /v1
    api_key: str
    model: str
    ray_dir: Path | None = None  # the Ray temp dir of this server's cluster, if it runs on Ray
    pid: int | None = None  # the server process, if it is one process tree
    embeddings: bool = False  # it serves an embedding model: ready when an embedding answers


def bench_model_type() -> dict[str, Any]:
    """The local profile's settings of the benchmarked type, as serve_config.yaml has them."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    [app] = config["applications"]
    return next(m for m in app["args"]["model_types"] if m["name"] == BENCH_TYPE)


@dataclass(frozen=True)
class BenchTarget:
    """What every server in a run serves, identically: one model and one set of engine args."""

    model: str = TINY_MODEL  # a local path or a Hugging Face id; TINY_MODEL: the generated one
    engine_args: dict[str, Any] = field(default_factory=dict)
    gpu: bool = False  # the node has a GPU: the service's model replica must ask Ray for one
    max_concurrency: int = 32
    start_timeout_s: float = 600

    def model_path(self) -> str:
        """What bare vLLM loads and the load generator tokenizes with."""
        return str(ensure(tiny_model_dir())) if self.model == TINY_MODEL else self.model


def bench_target(
    model: str | None, extra_engine_args: dict[str, Any], concurrencies: list[int], gpu: bool
) -> BenchTarget:
    """The tiny model with the local profile's engine args (`make bench`), or the operator's
    model with vLLM's own defaults: either way `extra_engine_args` on top, for every server.
    The profile's args are the tiny model's on two CPU cores (eager, a 512 MiB KV cache)."""
    if model is None:
        base, model = bench_model_type().get("engine_args", {}), TINY_MODEL
    else:
        base, local = {}, Path(model).expanduser()
        model = str(local.resolve()) if local.exists() else model
    return BenchTarget(
        model=model,
        engine_args={**base, **extra_engine_args},
        gpu=gpu,
        max_concurrency=max(concurrencies),
        # a real model may first be downloaded, then compiled and captured in CUDA graphs
        start_timeout_s=600 if model == TINY_MODEL else 1800,
    )


def service_model_type(target: BenchTarget) -> dict[str, Any]:
    """The benchmarked type as the service runs it in the benchmark, checked as `serviceai run`
    checks it: the target's model and engine args, a GPU per replica on a GPU node, and room in
    Serve for every client up to the engine's max_num_seqs (the config refuses more)."""
    model_type = {**bench_model_type(), "model": target.model, "engine_args": target.engine_args}
    model_type["model_env"] = None  # SERVICEAI_MODEL_FAST must not swap the model under the bench
    if target.model != TINY_MODEL:
        # hermes is the tiny model's tool-call format; bare vLLM runs without a parser
        model_type.pop("tool_call_parser", None)
    if target.gpu:
        model_type["num_gpus_per_shard"] = 1
        # The GPU node's setup is production's: the type deployed, a replica with the GPU.
        model_type["in_ingress"] = False
    ongoing = max(model_type.get("max_ongoing_requests", 64), target.max_concurrency)
    max_num_seqs = target.engine_args.get("max_num_seqs")
    if isinstance(max_num_seqs, int):
        ongoing = min(ongoing, max_num_seqs)
    model_type["max_ongoing_requests"] = ongoing
    queued = model_type.get("max_queued_requests", -1)
    if queued != -1:
        model_type["max_queued_requests"] = max(queued, target.max_concurrency)
    ModelTypeConfig.model_validate(model_type)
    return model_type


def service_config(
    target: BenchTarget,
    port: int,
    model_type: dict[str, Any] | None = None,
    plans: dict[str, Any] | None = None,
    ingress_replicas: int = 1,
) -> dict[str, Any]:
    """serve_config.yaml as the benchmark runs it: the benchmarked type alone, on `port`, with
    the settings in `model_type` on top (and `plans` instead of one generous free plan)."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    config["http_options"]["port"] = port
    [app] = config["applications"]
    app["args"]["ingress"]["num_replicas"] = ingress_replicas
    settings = model_type or {}
    entry = {**service_model_type(target), **settings}
    if "in_ingress" not in settings and (
        DEPLOYMENT_ONLY & settings.keys()
        or settings.get("num_replicas", 1) != 1
        or ingress_replicas != 1
    ):
        entry["in_ingress"] = False  # a setup that asks for a deployment's options gets one
    app["args"]["model_types"] = [entry]
    # Every request still passes the rate-limit check (its cost is measured), never refused.
    app["args"]["plans"] = plans or {"free": {BENCH_TYPE: BENCH_LIMITS}}
    return config


def bare_command(target: BenchTarget, port: int, api_servers: int = 1) -> list[str]:
    """vLLM's own OpenAI server on the target, under the name the service gives the model; with
    `api_servers` > 1, `vllm serve --api-server-count` (that many serving processes over one
    engine core, vLLM's own design of what `serving_processes` builds)."""
    flags = engine_cli_args(target.engine_args)
    if api_servers == 1:
        return vllm_command(target.model_path(), BENCH_TYPE, port, flags)
    flags += ["--api-server-count", str(api_servers)]
    return vllm_command(target.model_path(), BENCH_TYPE, port, flags, cli=True)


def vllm_command(
    model: str, served_name: str, port: int, flags: list[str], cli: bool = False
) -> list[str]:
    """`vllm serve` of `model` as `served_name` on `port`, with `flags` besides: the API server's
    module, or (`cli`) the `vllm serve` command itself, which alone runs several API servers."""
    return [
        str(BIN / "python"),
        "-m",
        *(
            ["bench.vllm_cli", "serve"]
            if cli
            else ["vllm.entrypoints.openai.api_server", "--model"]
        ),
        model,
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
        *flags,
    ]


def engine_cli_args(engine_args: dict[str, Any]) -> list[str]:
    """AsyncEngineArgs as `vllm serve` flags: {"max_model_len": 2048} -> ["--max-model-len", "2048"];
    a nested config (structured_outputs_config) as the JSON vLLM's parser reads."""
    args: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        elif value is not False:
            args += [flag, str(value)]
    return args


def _wait_for_chat(server: Server, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Ready means a one-token completion (or an embedding) succeeds (listing models answers
    before the engine is up)."""
    if server.embeddings:
        path, ask = "embeddings", {"model": server.model, "input": "hi"}
    else:
        messages = [{"role": "user", "content": "hi"}]
        path, ask = "chat/completions", {"model": server.model, "messages": messages}
        ask["max_tokens"] = 1
    body = json.dumps(ask).encode()
    request = urllib.request.Request(
        f"{server.base_url}/v1/{path}",
        data=body,
        headers={"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"},
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{server.name} exited during start-up; see {log}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{server.name} was not ready within {timeout_s:.0f} s; see {log}")


DASHBOARD = re.compile(rb"dashboard at \S*?(127\.0\.0\.1:\d+)")


def _wait_for_every_replica(process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Until Serve reports every application RUNNING: every replica asked for is up (a chat
    answers as soon as one is, and `serve run` of a config does not wait). Read from the
    dashboard's REST API, at the address `serve run` printed."""
    deadline = time.monotonic() + timeout_s
    found = DASHBOARD.search(log.read_bytes())
    url = f"http://{found.group(1).decode() if found else '127.0.0.1:8265'}/api/serve/applications/"
    # Ray's dashboard asks for the token Ray made for this user (as its own CLI sends it).
    token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    headers = {"Authorization": f"Bearer {token.read_text().strip()}"} if token.exists() else {}
    request = urllib.request.Request(url, headers=headers)
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"serve run exited during start-up; see {log}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                applications = json.load(response).get("applications", {})
            statuses = {name: app["status"] for name, app in applications.items()}
            if statuses and set(statuses.values()) == {"RUNNING"}:
                return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(
        f"applications not all RUNNING within the start-up time: {statuses}; see {log}"
    )


def stop_servers_on_sigterm() -> None:
    """A bench stopped with SIGTERM (`kill`, `pkill`) stops the servers it started, as Ctrl-C
    does: the signal unwinds its `with` blocks instead of ending the process where it stands
    (which left a whole service running, bench/NOTES.md)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _stop(process: subprocess.Popen, owned: list[psutil.Process], grace_s: float = 30) -> None:
    """SIGTERM the server, then SIGKILL whatever it started that is still alive."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
    for proc in owned:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, ValueError):
        return []


@contextmanager
def bare_vllm(
    target: BenchTarget, port: int, log_dir: Path, api_servers: int = 1
) -> Iterator[Server]:
    """vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`), or with
    `api_servers` > 1 `vllm serve --api-server-count`."""
    command = bare_command(target, port, api_servers)
    log = log_dir / ("bare-vllm.log" if api_servers == 1 else f"bare-vllm-a{api_servers}.log")
    with vllm_server(command, port, log, target.start_timeout_s) as server:
        yield server


@contextmanager
def vllm_server(
    command: list[str], port: int, log: Path, timeout_s: float = 600, embeddings: bool = False
) -> Iterator[Server]:
    """`command` (a `vllm_command`) running, until the block ends; ready once it answers."""
    served_name = command[command.index("--served-model-name") + 1]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT)
    server = Server(
        "bare vLLM",
        f"http://127.0.0.1:{port}",
        "unused",
        served_name,
        pid=process.pid,
        embeddings=embeddings,
    )
    try:
        _wait_for_chat(server, process, log, timeout_s)
        yield server
    finally:
        _stop(process, _descendants(process.pid))


@contextmanager
def local_service(
    model_type: dict[str, Any], plan: dict[str, Any], log: Path, embeddings: bool = False
) -> Iterator[Server]:
    """The service as `make run` starts it (the local profile), with `model_type` alone and
    one plan that gives it `plan`'s limits; a fresh key store and one key."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    port = free_port()
    config["http_options"]["port"] = port
    [app] = config["applications"]
    app["args"]["model_types"] = [model_type]
    app["args"]["plans"] = {"free": {model_type["name"]: plan}}
    ray_tmp = Path(tempfile.mkdtemp(prefix="sail-", dir="/tmp"))
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), **cluster_env(ray_tmp / "h", free_port)}
    key = _provision_key(env, ray_tmp)
    server = Server(
        "ServiceAi",
        f"http://127.0.0.1:{port}",
        key,
        model_type["name"],
        ray_tmp,
        embeddings=embeddings,
    )
    with _serve_run(server, config, env, log, 600):
        yield server


@contextmanager
def serviceai(
    target: BenchTarget,
    port: int,
    log_dir: Path,
    extra_env: dict[str, str],
    model_type: dict[str, Any] | None = None,
    log_name: str = "serviceai.log",
    plans: dict[str, Any] | None = None,
    ingress_replicas: int = 1,
) -> Iterator[Server]:
    """This service as `make run` starts it (`serve run`), with only the benchmarked model type
    (and the settings in `model_type` on top of the profile's, the `plans` if given).
    Several ingress replicas count limits each in its own memory: generous plans only."""
    config = service_config(target, port, model_type, plans, ingress_replicas)
    ray_tmp = Path(tempfile.mkdtemp(prefix="saib-", dir="/tmp"))
    runtime = cluster_env(ray_tmp / "h", free_port)
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), **runtime, **extra_env}
    if ingress_replicas > 1:
        env.setdefault("SERVICEAI_SESSION_SECRET", secrets.token_hex(32))
    api_key = _provision_key(env, ray_tmp)
    server = Server("ServiceAi", f"http://127.0.0.1:{port}", api_key, BENCH_TYPE, ray_tmp)
    with _serve_run(server, config, env, log_dir / log_name, target.start_timeout_s):
        yield server


@contextmanager
def ray_serve_llm(
    target: BenchTarget,
    port: int,
    log_dir: Path,
    direct: bool,
    replicas: int = 1,
    request_router: str | None = None,
    model_id: str = BENCH_TYPE,
    embeddings: bool = False,
    max_ongoing_requests: int | None = None,
) -> Iterator[Server]:
    """Ray's own `ray.serve.llm` (bench/ray_serve_llm.py) on the same model and engine arguments,
    serving it as `model_id` (an embedding model with `embeddings`: vLLM's pooling runner in the
    engine arguments), each replica taking Serve's `max_ongoing_requests` as the service's does
    (the benchmarked type's unless given).

    Default: Ray's defaults (Python proxy, handle streaming from the LLM server to its OpenAI
    ingress). Direct: the LLM server replica is the ingress, behind HAProxy, with Serve's
    throughput-optimized runtime, as in Ray's own fastest configuration.
    """
    if max_ongoing_requests is None:
        max_ongoing_requests = service_model_type(target)["max_ongoing_requests"]
    args = {
        "model_id": model_id,
        "model_dir": target.model_path(),
        "engine_args": target.engine_args,
        "gpu": target.gpu,
        "max_ongoing_requests": max_ongoing_requests,
        "num_replicas": replicas,
        "request_router": request_router,
    }
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {
                "name": "llm",
                "route_prefix": "/",
                "import_path": "bench.ray_serve_llm:build_app",
                "args": args,
            }
        ],
    }
    ray_tmp = Path(tempfile.mkdtemp(prefix="sairl-", dir="/tmp"))
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RAY_worker_niceness": "0"}
    if direct:
        env |= cluster_env(ray_tmp / "h", free_port)
        env.pop("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH")  # ours, not Ray's
        env["RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"] = "1"
    name = "Ray Serve LLM direct" if direct else "Ray Serve LLM"
    server = Server(
        name, f"http://127.0.0.1:{port}", "unused", model_id, ray_tmp, embeddings=embeddings
    )
    log = log_dir / ("ray-serve-llm-direct.log" if direct else "ray-serve-llm.log")
    with _serve_run(server, config, env, log, target.start_timeout_s):
        yield server


@contextmanager
def _serve_run(
    server: Server, config: dict[str, Any], env: dict[str, str], log: Path, timeout_s: float
) -> Iterator[None]:
    """`serve run` of `config` in its own Ray cluster (in server.ray_dir), until the block ends."""
    assert server.ray_dir is not None
    config_path = server.ray_dir / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    with open(log, "w") as out:
        process = subprocess.Popen(
            [str(BIN / "serve"), "run", str(config_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=PROJECT_ROOT,
            env=env,
        )
    try:
        started = time.monotonic()
        _wait_for_chat(server, process, log, timeout_s)
        _wait_for_every_replica(process, log, timeout_s - (time.monotonic() - started))
        yield
    finally:
        _stop(process, [p for p in psutil.process_iter() if _uses(p, server.ray_dir)])
        shutil.rmtree(server.ray_dir, ignore_errors=True)


def _provision_key(env: dict[str, str], folder: Path) -> str:
    """A key the started service accepts: a fresh SQLite key store in `folder`, one user, one key."""
    env["SERVICEAI_DATABASE_URL"] = f"sqlite+aiosqlite:///{folder / 'keys.db'}"
    return provision_key(env["SERVICEAI_DATABASE_URL"], "bench@serviceai.local")


def provision_key(database_url: str, email: str, plan: str = "free") -> str:
    """A new user on `plan` in the key store at `database_url`, and a key of theirs."""

    async def issue() -> str:
        store = await open_store(Settings(database_url=database_url))
        try:
            user = await store.create_user(email, plan)
            return (await store.create_key(user.id, "bench")).key
        finally:
            await store.database.close()

    return asyncio.run(issue())


def _uses(process: psutil.Process, path: Path) -> bool:
    try:
        return str(path) in " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def bare_pids(server: Server) -> dict[str, int]:
    """Pids of the bare vLLM server by role (api server, engine core), for profiling. With
    several API servers the first process only launches and watches them (`api_server`); each
    is `api_server_1`, ... (vLLM titles them `VLLM::APIServer_0`, ...)."""
    assert server.pid is not None
    found = {"api_server": server.pid}
    for child in _descendants(server.pid):
        if _is_engine_core(child):
            found["engine_core"] = child.pid
        elif _titled(child, "APIServer"):
            found[f"api_server_{sum(r.startswith('api_server_') for r in found) + 1}"] = child.pid
    return found


def replica_pids(server: Server, settle_s: float = 30) -> dict[str, int]:
    """Pids of a Serve server's Ray processes by role, for profiling: this service's or Ray Serve
    LLM's. The Serve replica whose children hold vLLM's engine core is "model", another replica
    (an ingress: this service's, or Ray Serve LLM's OpenAI ingress in its default mode) is
    "ingress"; Serve's proxy and HAProxy where they run.

    Two replicas in one role (seen once in a `make bench` run, cause not caught: a replica being
    replaced, or a model replica whose engine was not found) are looked for again until
    `settle_s` has passed; then the error names both."""
    deadline = time.monotonic() + settle_s
    while True:
        found, clash = _replica_pids_once(server)
        if not clash:
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{server.name} runs two {clash[0]} replicas; the bench expects "
                f"one: {_describe(clash[1])}; {_describe(clash[2])}"
            )
        time.sleep(1)


def _replica_pids_once(server: Server) -> tuple[dict[str, int], tuple[str, int, int] | None]:
    """`replica_pids` at one moment, and the first role held by two replicas (role, pids)."""
    found: dict[str, int] = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if not (
            server.ray_dir and cmdline.startswith("ray::") and _uses(proc.parent(), server.ray_dir)
        ):
            continue
        if cmdline.startswith("ray::ServeReplica:"):
            engines = [c for c in _descendants(proc.pid) if _is_engine_core(c)]
            if not engines and ":ServiceAi-" in cmdline:
                # A type's further serving process: a replica of its gang without the engine
                # core, which rank 0 launched (deployments/serving_processes.py).
                found[f"serving_{sum(r.startswith('serving_') for r in found) + 1}"] = proc.pid
                continue
            role = "model" if engines else "ingress"
            if role in found:
                return found, (role, found[role], proc.pid)
            found[role] = proc.pid
            if engines:
                found["engine_core"] = engines[0].pid
        elif cmdline.startswith("ray::ProxyActor"):
            found["proxy"] = proc.pid
        elif cmdline.startswith("ray::HAProxyManager"):
            for child in _descendants(proc.pid):
                if child.name() == "haproxy":
                    found["haproxy"] = child.pid
    return found, None


def _describe(pid: int) -> str:
    """A process's pid, command line, age and children, for an error message."""
    try:
        proc = psutil.Process(pid)
        children = [f"{c.pid} {c.name()}" for c in _descendants(pid)]
        age_s = time.time() - proc.create_time()
        return f"{pid} {' '.join(proc.cmdline())[:80]!r}, up {age_s:.0f} s, children {children}"
    except psutil.Error as exc:
        return f"{pid} ({type(exc).__name__})"


def _is_engine_core(process: psutil.Process) -> bool:
    return _titled(process, "EngineCore")


def _titled(process: psutil.Process, title: str) -> bool:
    """vLLM titles its processes `VLLM::EngineCore`, `VLLM::APIServer_0`, ...; the kernel's name
    for one may be cut to 15 characters, the command line is not."""
    try:
        return title in process.name() or title in " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


FRONT_ENDS = {"ingress", "model", "proxy", "haproxy", "api_server"}
"""The roles on the serving path that are neither the engine core nor its worker: a model
replica's or api_server's engine children are not counted with them (cpu_profile); with the
model replica's serving processes (`serving_1`, ...) and bare vLLM's several API servers
(`api_server_1`, ...: `front_end`)."""


def front_end(role: str) -> bool:
    return role in FRONT_ENDS or role.startswith(("serving_", "api_server_"))
