"""The GPU build is locked as the CPU build is: constraints-gpu.txt pins every direct dependency
at pyproject.toml's version and agrees with the CPU lock but where vLLM's CUDA build needs
otherwise; cluster.yaml's nodes and the Kubernetes image install with it."""

from __future__ import annotations

import re
import tomllib

from app.config.settings import PROJECT_ROOT

GPU_ONLY_VERSIONS = {"torch", "triton", "apache-tvm-ffi"}
"""Packages whose CUDA build vLLM pins apart from the CPU build's."""


def pins(name: str) -> dict[str, str]:
    lines = (PROJECT_ROOT / name).read_text().splitlines()
    return {
        normal(line.split("==")[0]): line.split("==")[1]
        for line in lines
        if "==" in line and not line.startswith("#")
    }


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_direct_dependency_of_the_gpu_build_is_pinned_as_pyproject_pins_it():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["gpu"]
    locked = pins("constraints-gpu.txt")
    for requirement in declared + project["optional-dependencies"]["dev"]:
        name, version = re.match(r"([\w.-]+)(?:\[[\w,]+\])?==([\w.+-]+)", requirement).groups()
        assert locked.get(normal(name)) == version, requirement
    assert "torch" in locked and "+cpu" not in locked["torch"]


def test_the_gpu_and_cpu_locks_agree_but_where_the_cuda_build_needs_otherwise():
    cpu, gpu = pins("constraints-cpu.txt"), pins("constraints-gpu.txt")
    differ = {name for name in cpu.keys() & gpu.keys() if cpu[name] != gpu[name]}
    assert differ <= GPU_ONLY_VERSIONS, differ


def test_the_cluster_and_the_image_install_the_locked_tree():
    cluster = (PROJECT_ROOT / "cluster.yaml").read_text()
    installs = [
        line for line in cluster.splitlines() if "uv pip install" in line and "serviceai" in line
    ]
    assert installs and all("-c ~/serviceai/constraints-gpu.txt" in line for line in installs)
    image = (PROJECT_ROOT / "deploy" / "kubernetes" / "Dockerfile").read_text()
    assert 'pip install --no-cache-dir -c constraints-gpu.txt ".[gpu]"' in image
    assert "constraints-gpu.txt ./" in image
