"""An ingress-only application with two replicas over the stack's engines, on each store:
the done-when flow, and a revocation that reaches every replica within the cache TTL."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
from ray import serve

from app.builder import build_app
from tests.conftest import APP_NAME, BACKENDS, PostgresDatabases, app_args
from tests.e2e.conftest import serviceai_cli

TTL_S = 2.0
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=BACKENDS)
def two_replicas(request, stack, postgres: PostgresDatabases):
    """(base URL, database URL) of a 2-replica ingress on the SQLite store of the stack or on a
    new PostgreSQL database."""
    if request.param == "sqlite":
        database_url = stack.database_url
    else:
        database_url = asyncio.run(postgres.create())
    name = f"keys-{request.param}"
    args = dict(app_args(), models_app=APP_NAME)
    args["ingress"] = dict(
        args["ingress"],
        num_replicas=2,
        env_vars={"SERVICEAI_DATABASE_URL": database_url, "SERVICEAI_KEY_CACHE_TTL_S": str(TTL_S)},
    )
    serve.run(build_app(args), name=name, route_prefix=f"/{name}")
    try:
        replicas = serve.status().applications[name].deployments["Ingress"].replica_states
        assert replicas == {"RUNNING": 2}
        yield f"{stack.origin}/{name}/v1", database_url
    finally:
        serve.delete(name)


def test_done_when_and_revocation_on_every_replica(stack, two_replicas):
    base_url, database_url = two_replicas
    created = serviceai_cli(
        database_url, "users", "create", "--email", "two@example.com", "--with-key", "--json"
    )
    key = created["key"]["key"]
    stack.secrets.append(key)
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    assert client.chat.completions.create(model="ServiceAi-Pro", messages=HI, max_tokens=3).choices
    for _ in range(40):  # enough that both replicas have verified, and cached, the key
        client.models.list()

    serviceai_cli(database_url, "keys", "revoke", created["key"]["id"], "--json")
    revoked_at = time.monotonic()
    while True:
        outcomes = []
        for _ in range(20):
            try:
                client.models.list()
                outcomes.append("accepted")
            except openai.AuthenticationError as exc:
                assert "revoked" in exc.body["message"]
                outcomes.append("refused")
        if set(outcomes) == {"refused"}:
            break
        assert time.monotonic() - revoked_at < TTL_S + 3, "a replica still accepts the revoked key"
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="ServiceAi-Pro", messages=HI, max_tokens=3)
