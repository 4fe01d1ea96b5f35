"""LoRA adapters registered at run time: the store's records, the admin API and the CLI that
write them (the CLI: tests/app/cli/test_cli.py), each ingress's reading of them, and what a
request naming one gets. The replicas
load them for real in tests/e2e/test_adapters.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from pydantic import SecretStr

from app.accounts.auth import KeyVerifier
from app.accounts.keystore.errors import AdapterExists, AdapterNotFound, StoreUnavailable
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.openai.errors import ApiError
from app.serving.adapters import (
    RegisteredAdapters,
    adapter_path,
    check_adapter_path,
    check_registrable,
)
from app.serving.endpoints import ModelEndpoints
from deployments.wire import ModelInfo
from tests.app.conftest import ADMIN_TOKEN, bearer, shipped_limits
from tests.app.serve_fakes import FakeHandle
from tests.conftest import error_of

LORA = ModelInfo("T", 64, adapters=("T:acme",), lora=True)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_store_registers_lists_and_removes_adapters_audited(store):
    from app.accounts.keystore.audit import Actor

    actor = Actor.command_line()
    added = await store.register_adapter("T", "beta", "/models/beta", actor=actor)
    assert (added.id, added.model, added.name, added.path) == (
        "T:beta",
        "T",
        "beta",
        "/models/beta",
    )
    await store.register_adapter("T", "alpha", "org/alpha")
    await store.register_adapter("U", "alpha", "/u/alpha")
    assert [a.id for a in await store.adapters()] == ["T:alpha", "T:beta", "U:alpha"]
    assert [a.id for a in await store.adapters("U")] == ["U:alpha"]
    with pytest.raises(AdapterExists):
        await store.register_adapter("T", "beta", "/elsewhere")
    assert (await store.remove_adapter("T", "beta", actor=actor)).path == "/models/beta"
    with pytest.raises(AdapterNotFound):
        await store.remove_adapter("T", "beta")
    actions = [(e.action, e.target) for e in (await store.audit_log()).data]
    assert actions == [("adapter.remove", "T:beta"), ("adapter.register", "T:beta")]


async def test_an_ingress_reads_them_at_most_once_a_ttl_and_keeps_them_while_the_store_is_away(
    store, monkeypatch
):
    clock = Clock()
    registered = RegisteredAdapters(store, ttl_s=10, clock=clock)
    assert await registered.paths("T") == {}
    await store.register_adapter("T", "beta", "/b")
    assert await registered.paths("T") == {}  # read 0 s ago
    clock.now = 10
    assert await registered.paths("T") == {"T:beta": "/b"}
    await store.remove_adapter("T", "beta")
    registered.forget()  # this replica changed the store itself
    assert await registered.paths("T") == {}

    await store.register_adapter("T", "gamma", "/g")

    async def away(model_type=None):
        raise StoreUnavailable("away")

    monkeypatch.setattr(store, "adapters", away)
    clock.now = 30
    assert await registered.paths("T") == {}  # the last reading stays
    with pytest.raises(StoreUnavailable):  # nothing read yet: nothing to fall back on
        await RegisteredAdapters(store).paths("T")


async def test_a_request_for_an_adapter_gets_its_path_a_404_or_a_503(store):
    registered = RegisteredAdapters(store, ttl_s=0)
    await store.register_adapter("T", "beta", "/b")
    assert await adapter_path(registered, None, LORA) is None
    assert await adapter_path(registered, "T:acme", LORA) is None  # the config's: held
    assert await adapter_path(registered, "T:beta", LORA) == "/b"
    with pytest.raises(ApiError) as unknown:
        await adapter_path(registered, "T:gamma", LORA)
    assert (unknown.value.status, unknown.value.code) == (404, "model_not_found")
    assert "T:acme" not in unknown.value.message and "GET /v1/models" in unknown.value.message
    with pytest.raises(ApiError) as no_lora:
        await adapter_path(registered, "T:beta", ModelInfo("T", 64))
    assert (no_lora.value.status, no_lora.value.code) == (503, "model_unavailable")
    assert "/b" not in no_lora.value.message  # a path is the operator's, not the client's


@pytest.mark.parametrize(
    "info, status, code",
    [
        (LORA, None, None),
        (ModelInfo("T", 64), 400, "model_not_supported"),
        (ModelInfo("T", 64, embedding=True), 400, "model_not_supported"),
    ],
)
async def test_registration_asks_the_types_running_replicas(info, status, code):
    async def model_info():
        return info

    replicas = [1]
    endpoint = SimpleNamespace(handle=None, info=model_info, running=lambda: replicas[0])
    models = SimpleNamespace(names=["T"], get=lambda name: endpoint)
    if status is None:
        await check_registrable(models, "T", "beta")
        with pytest.raises(ApiError) as taken:
            await check_registrable(models, "T", "acme")  # the config holds it
        assert (taken.value.status, taken.value.code) == (409, "adapter_exists")
        return
    with pytest.raises(ApiError) as refused:
        await check_registrable(models, "T", "beta")
    assert (refused.value.status, refused.value.code) == (status, code)
    replicas[0] = 0
    await check_registrable(models, "T", "beta")  # no replica to ask: taken at its word


@pytest.fixture
async def admin_of_t(store):
    """The API over one model type, T, that no replica serves yet, with the admin API on."""
    app = create_api(
        ModelEndpoints({"T": FakeHandle("T")}, created=0),
        KeyVerifier(store),
        shipped_limits(),
        UsageMeter(store),
        SecretStr(ADMIN_TOKEN),
        adapters=RegisteredAdapters(store, roots=[Path("/models")]),
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://test", headers=bearer(ADMIN_TOKEN)
    ) as client:
        yield client


async def test_the_admin_api_registers_lists_and_removes_them(admin_of_t, store):
    body = {"model": "T", "name": "acme-sql", "path": "/models/acme"}
    created = await admin_of_t.post("/admin/adapters", json=body)
    assert created.status_code == 201, created.text
    assert {k: created.json()[k] for k in ("object", "id", "path")} == {
        "object": "lora_adapter",
        "id": "T:acme-sql",
        "path": "/models/acme",
    }
    assert error_of(await admin_of_t.post("/admin/adapters", json=body), 409)["code"] == (
        "adapter_exists"
    )
    unknown = error_of(await admin_of_t.post("/admin/adapters", json={**body, "model": "U"}), 400)
    assert (unknown["code"], unknown["param"]) == ("model_not_found", "model")
    bad = error_of(await admin_of_t.post("/admin/adapters", json={**body, "name": "a b"}), 400)
    assert bad["param"] == "name"
    listed = (await admin_of_t.get("/admin/adapters")).json()
    assert [a["id"] for a in listed["data"]] == ["T:acme-sql"]
    assert (await admin_of_t.delete("/admin/adapters/T:acme-sql")).json()["id"] == "T:acme-sql"
    gone = error_of(await admin_of_t.delete("/admin/adapters/T:acme-sql"), 404)
    assert gone["code"] == "adapter_not_found"
    assert (await admin_of_t.get("/admin/adapters")).json()["data"] == []
    assert [e.source for e in (await store.audit_log()).data] == ["admin_api", "admin_api"]


async def test_an_adapter_path_outside_the_configured_roots_is_refused_by_name(
    admin_of_t, store, tmp_path
):
    """Issue 70: an adapter's path could be any path the nodes read. Now it lies in
    SERVICEAI_ADAPTER_ROOTS (its real path: no `..` or symlink leads out), or is a hub id."""
    (tmp_path / "out").symlink_to("/etc")
    for path in ("/etc/ssh", "/models/../etc", "relative/../../etc", f"{tmp_path}/out"):
        body = {"model": "T", "name": "x", "path": path}
        error = error_of(await admin_of_t.post("/admin/adapters", json=body), 400)
        assert (error["code"], error["param"]) == ("adapter_path_not_allowed", "path"), path
        assert "SERVICEAI_ADAPTER_ROOTS or" in error["message"]  # the setting, not its folders
    assert await store.adapters() == []
    for name, path in (("hub", "acme/sql-lora"), ("kept", "/models/acme")):
        body = {"model": "T", "name": name, "path": path}
        assert (await admin_of_t.post("/admin/adapters", json=body)).status_code == 201
    check_adapter_path("/models/x", [Path("/models")], hub_ids=False)
    with pytest.raises(ApiError) as no_hub:
        check_adapter_path("acme/sql-lora", [Path("/models")], hub_ids=False)
    assert "Hugging Face" not in no_hub.value.message
