"""Fixtures shared by the whole suite. The real stack is started once per session, on demand."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from app.accounts.keystore import Database, KeyStore
from app.serving.ray_runtime import cluster_env, free_port

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SERVE_CONFIG = PROJECT_ROOT / "serve_config.yaml"
APP_NAME = "serviceai"
# Everything that starts Ray and vLLM on this 2-core machine takes this lock first, so that
# two test sessions (or a test session and `make bench`) never share the cores.
STACK_LOCK = Path(tempfile.gettempdir()) / "serviceai-stack.lock"
# The PostgreSQL of this machine (trust auth). Every test run creates its own databases on it,
# named after RUN_ID, and drops them at the end.
POSTGRES = os.environ.get("SERVICEAI_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
# The Redis of this machine; `make test` points both at throw-away servers where none answers.
REDIS = os.environ.get("SERVICEAI_TEST_REDIS", "redis://127.0.0.1:6379/0")
RUN_ID = f"serviceai_test_{os.getpid()}_{secrets.token_hex(3)}"
BACKENDS = ["sqlite", "postgresql"]


def error_of(response, status: int) -> dict:
    """The `error` of an OpenAI error envelope, after checking the status and the shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in response.text
    return body["error"]


def app_args(
    config_path: Path = SERVE_CONFIG, name: str = APP_NAME, deployed: bool = True
) -> dict[str, Any]:
    """The `args` of application `name` in a serve config file; with `deployed`, every model
    type a deployment of its own (`in_ingress` off): the shape the test stack and the tests'
    variants of a type run, where replicas are killed, counted and multiplied. The local
    profile's engine in the ingress is tests/e2e/test_in_ingress.py's and test_run_stop.py's."""
    config = yaml.safe_load(config_path.read_text())
    args = next(a for a in config["applications"] if a["name"] == name)["args"]
    if deployed:
        for model_type in args["model_types"]:
            if isinstance(model_type, dict):
                model_type.pop("in_ingress", None)
    return args


def type_limits(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan's entry in a serve config without its `priority`: its limits by model type."""
    return {name: limits for name, limits in plan.items() if name != "priority"}


class PostgresDatabases:
    """Creates throw-away databases on the test PostgreSQL server; drops them all at the end."""

    def __init__(self) -> None:
        self._created: list[str] = []
        self._scratch: str | None = None

    async def create(self) -> str:
        """A new, empty database; its SQLAlchemy URL."""
        name = f"{RUN_ID}_{len(self._created)}"
        connection = await asyncpg.connect(POSTGRES)
        try:
            await connection.execute(f'CREATE DATABASE "{name}"')
        finally:
            await connection.close()
        self._created.append(name)
        return url_of_database(name)

    async def empty(self) -> str:
        """The run's scratch database, emptied (dropping a database per test is slow)."""
        if self._scratch is None:
            self._scratch = await self.create()
        connection = await asyncpg.connect(self._scratch.replace("+asyncpg", ""))
        try:
            await connection.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        finally:
            await connection.close()
        return self._scratch

    async def drop_all(self) -> None:
        connection = await asyncpg.connect(POSTGRES)
        try:
            for name in self._created:
                await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await connection.close()
        self._created.clear()


def url_of_database(name: str) -> str:
    server = POSTGRES.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    return f"{server}/{name}"


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresDatabases]:
    databases = PostgresDatabases()
    yield databases
    asyncio.run(databases.drop_all())


@pytest.fixture(params=BACKENDS)
async def database_url(request, tmp_path: Path, postgres: PostgresDatabases) -> str:
    """An empty database of each kind: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    return await postgres.empty()


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[KeyStore]:
    database = await Database.open(database_url)
    yield KeyStore(database, max_keys_per_user=5)
    await database.close()


@dataclass
class Stack:
    """A running ServiceAi: Ray Serve with the ingress and the local profile's model types.

    Its key store is a SQLite file; `secrets` collects every key and token the session used,
    so that a last test can prove none of them reached a log.
    """

    origin: str
    api_key: str
    ray_dir: Path
    database_url: str
    admin_token: str
    key_cache_ttl_s: float
    metrics_url: str
    secrets: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def handle(self, deployment: str, app: str = APP_NAME):
        from ray import serve

        return serve.get_deployment_handle(deployment, app)

    def log_files(self) -> list[Path]:
        return [
            p
            for p in self.ray_dir.rglob("*")
            if p.is_file() and p.suffix in (".log", ".out", ".err")
        ]


@pytest.fixture(scope="session")
def stack_lock() -> Iterator[None]:
    with open(STACK_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


STACK_KEY_CACHE_TTL_S = 3.0
STACK_USAGE_FLUSH_S = 1.0


@pytest.fixture(scope="session")
def stack(stack_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    import ray
    from ray import serve

    from app.builder import build_app

    ray_dir = Path(tempfile.mkdtemp(prefix="sai-ray-", dir="/tmp"))
    store_dir = Path(tempfile.mkdtemp(prefix="sai-keys-", dir="/tmp"))
    database_url = f"sqlite+aiosqlite:///{store_dir / 'keys.db'}"
    admin_token = secrets.token_urlsafe(32)
    # Shared by every ingress replica: the tests that run two would refuse to start without.
    session_secret = secrets.token_urlsafe(32)
    api_key = asyncio.run(_first_key(database_url))
    # Ray's workers, the ingress replicas among them, inherit this environment.
    os.environ["SERVICEAI_DATABASE_URL"] = database_url
    os.environ["SERVICEAI_ADMIN_TOKEN"] = admin_token
    os.environ["SERVICEAI_SESSION_SECRET"] = session_secret
    os.environ["SERVICEAI_KEY_CACHE_TTL_S"] = str(STACK_KEY_CACHE_TTL_S)
    os.environ["SERVICEAI_USAGE_FLUSH_S"] = str(STACK_USAGE_FLUSH_S)
    os.environ["HF_HUB_OFFLINE"] = "1"  # no hub on these machines: fail fast, never hang
    # The adapters the tests register lie in the session's own temporary folders.
    os.environ["SERVICEAI_ADAPTER_ROOTS"] = json.dumps([str(tmp_path_factory.getbasetemp())])
    # Every stream that finds a feed open uses it (by default one waits for 16 on one replica),
    # so that the suite runs streams both ways: on their own call and on a feed.
    os.environ["SERVICEAI_STREAM_FEED_MIN_STREAMS"] = "1"
    # The same Ray Serve runtime as `make run` and production, with this session's own HAProxy.
    runtime = cluster_env(ray_dir / "h", free_port)
    # Throughput-optimized Serve buffers 1000 request-path log lines before writing them; the
    # tests that read the logs need each line on disk when the request is done.
    runtime["RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE"] = "1"
    os.environ.update(runtime)
    port = free_port()
    # What the console's quick-start shows: this stack's own address.
    os.environ["SERVICEAI_PUBLIC_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
    metrics_port = free_port()
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(ray_dir),
        object_store_memory=512 * 1024 * 1024,
        # Ray's Prometheus endpoint, exported every second (default 10 s) so tests wait less.
        _metrics_export_port=metrics_port,
        _system_config={"metrics_report_interval_ms": 1000},
    )
    try:
        # The local profile's address (127.0.0.1), so tests/e2e/test_exposure.py checks it.
        host = yaml.safe_load(SERVE_CONFIG.read_text())["http_options"]["host"]
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(stack_app_args()), name=APP_NAME, route_prefix="/")
        origin = f"http://127.0.0.1:{port}"
        _wait_until_every_type_answers(origin, api_key)
        yield Stack(
            origin=origin,
            api_key=api_key,
            ray_dir=ray_dir,
            database_url=database_url,
            admin_token=admin_token,
            key_cache_ttl_s=STACK_KEY_CACHE_TTL_S,
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
            secrets=[api_key, admin_token, session_secret],
        )
    finally:
        serve.shutdown()
        ray.shutdown()
        for name in (
            "SERVICEAI_DATABASE_URL",
            "SERVICEAI_ADMIN_TOKEN",
            "SERVICEAI_SESSION_SECRET",
            "SERVICEAI_KEY_CACHE_TTL_S",
            "SERVICEAI_STREAM_FEED_MIN_STREAMS",
            "SERVICEAI_USAGE_FLUSH_S",
            "SERVICEAI_PUBLIC_BASE_URL",
            "SERVICEAI_ADAPTER_ROOTS",
            *runtime,
        ):
            os.environ.pop(name, None)
        shutil.rmtree(ray_dir, ignore_errors=True)
        shutil.rmtree(store_dir, ignore_errors=True)


PROCESSES_TYPE = "ServiceAi-Pro"
"""The type the stack serves with two serving processes, a gang of two replicas over one engine
(deployments/serving_processes.py)."""


def stack_app_args() -> dict[str, Any]:
    """The local profile's app, with ServiceAi-Pro on two serving processes over its engine:
    every test of Pro (the Messages API's aliases land there too) runs through both, and the
    engine-death tests kill a core that two processes share."""
    args = app_args()
    for model_type in args["model_types"]:
        if model_type["name"] == PROCESSES_TYPE:
            model_type.update(serving_processes=2)
    return args


def _wait_until_every_type_answers(origin: str, api_key: str, timeout_s: float = 60) -> None:
    """Serve reports the app running before HAProxy routes to it: wait for real answers."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    for model_type in app_args()["model_types"]:
        model = model_type["name"]
        if model_type.get("task") == "embed":
            path, body = "/v1/embeddings", {"model": model, "input": "hi"}
        else:
            messages = [{"role": "user", "content": "hi"}]
            path, body = "/v1/chat/completions", {"model": model, "messages": messages}
            body["max_tokens"] = 1
        while True:
            try:
                response = httpx.post(
                    origin + path,
                    headers={"Authorization": f"Bearer {api_key}"},
                    json=body,
                    timeout=30,
                )
                if response.status_code == 200:
                    break
                problem = f"{response.status_code} {response.text[:300]}"
            except httpx.TransportError as exc:
                problem = repr(exc)
            assert time.monotonic() < deadline, problem
            time.sleep(0.5)


async def _first_key(database_url: str) -> str:
    """A user and a key made through the real store, as `serviceai users create` would. The
    user is on the pro plan: the suite calls Pro and Coder more than 10 times a minute."""
    database = await Database.open(database_url)
    try:
        store = KeyStore(database)
        user = await store.create_user("e2e@serviceai.test", plan="pro")
        return (await store.create_key(user.id, "e2e")).key
    finally:
        await database.close()
