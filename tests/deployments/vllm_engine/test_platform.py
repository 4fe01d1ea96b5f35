"""How an engine is built on this platform (vLLM's CPU build here): its CPU binding, its
tensor-parallel shards."""

from __future__ import annotations

import os

from deployments.deployment_options import engine_kwargs
from deployments.model_type import ModelTypeConfig
from deployments.vllm_engine.engine import _for_this_platform


def test_cpu_build_runs_tensor_parallel_shards_as_local_processes(monkeypatch):
    # Recorded first, so that the binding set below does not outlive this test: inherited by
    # the e2e stack's engines, "0,2|1,3" named CPUs a 2-core machine does not have.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    config = ModelTypeConfig(name="ServiceAi-Pro", tensor_parallel_size=2, num_gpus_per_shard=1)
    kwargs = engine_kwargs(config, "/models/tiny")
    assert kwargs["distributed_executor_backend"] == "ray"  # what a GPU build gets
    # vLLM CPU: "ValueError: current platform cpu does not support ray."
    assert _for_this_platform(kwargs) == {**kwargs, "distributed_executor_backend": "mp"}
    # One NUMA node is not enough for vLLM's own binding: each shard gets its own CPUs.
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,2|1,3"


def test_a_single_shard_engine_runs_unbound_with_its_cpu_shares_threads(monkeypatch):
    for name in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    kwargs = engine_kwargs(ModelTypeConfig(name="ServiceAi-Fast"), "/models/tiny")
    assert _for_this_platform(kwargs) is kwargs
    # vLLM's "auto" would pin every engine of a node to the same cores.
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    # Its worker runs in the engine core's process: no worker process spinning beside it.
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # An operator's own binding stands.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert _for_this_platform(kwargs) is kwargs
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0"
