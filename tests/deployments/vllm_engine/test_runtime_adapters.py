"""Adapters registered at run time, as one serving process loads them: once, whatever the
requests that wait, again only for a new path; a load that fails is the client's 503. The
engine loads real ones in tests/e2e/test_adapters.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from deployments.vllm_engine.adapters import RUNTIME_IDS, RuntimeAdapters, adapter_id
from deployments.wire import EngineUnavailable


class Engine:
    """An engine client that records what it is asked to load and takes a while to."""

    def __init__(self, fails: bool = False) -> None:
        self.loaded: list = []
        self.fails = fails

    async def add_lora(self, request) -> bool:
        await asyncio.sleep(0.01)
        if self.fails:
            raise ValueError("Loading lora T:beta failed: No adapter found for /nowhere")
        self.loaded.append(request)
        return True


def adapters(engine: Engine) -> tuple[RuntimeAdapters, SimpleNamespace]:
    models = SimpleNamespace(lora_requests={})
    return RuntimeAdapters("T", models, engine), models


def test_an_adapters_id_is_its_name_and_path_in_every_process():
    assert adapter_id("T:beta", "/b") == adapter_id("T:beta", "/b") >= RUNTIME_IDS
    assert adapter_id("T:beta", "/b2") != adapter_id("T:beta", "/b")
    assert adapter_id("T:gamma", "/b") != adapter_id("T:beta", "/b")


async def test_requests_that_wait_for_one_adapter_load_it_once():
    engine = Engine()
    runtime, models = adapters(engine)
    await asyncio.gather(*(runtime.load("T:beta", "/b") for _ in range(8)))
    assert [(r.lora_name, r.lora_path) for r in engine.loaded] == [("T:beta", "/b")]
    assert models.lora_requests["T:beta"] is engine.loaded[0]
    await runtime.load("T:beta", "/b")
    assert len(engine.loaded) == 1
    await runtime.load("T:beta", "/b2")  # registered again elsewhere: new weights, new id
    assert [r.lora_path for r in engine.loaded] == ["/b", "/b2"]
    assert engine.loaded[0].lora_int_id != engine.loaded[1].lora_int_id


async def test_a_load_that_fails_is_a_503_that_names_no_path_and_holds_nothing():
    runtime, models = adapters(Engine(fails=True))
    with pytest.raises(EngineUnavailable) as failed:
        await runtime.load("T:beta", "/nowhere")
    assert failed.value.status == 503 and "T:beta" in failed.value.message
    assert "/nowhere" not in failed.value.message
    assert models.lora_requests == {}


async def test_a_stream_starts_once_its_adapter_is_held():
    engine = Engine()
    runtime, models = adapters(engine)

    async def parts():
        assert "T:beta" in models.lora_requests  # what vLLM's serving layer looks up
        yield "part"

    assert [p async for p in runtime.loaded_first("T:beta", "/b", parts())] == ["part"]
