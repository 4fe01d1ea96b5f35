"""The GPU build is locked as the CPU build is: constraints-gpu.txt pins every direct dependency
at pyproject.toml's version and agrees with the CPU lock but where vLLM's CUDA build needs
otherwise; cluster.yaml's nodes and the Kubernetes image install with it."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

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


def make_run_plan(tmp_path: Path, nvidia_smi: str | None, *args: str) -> str:
    """What `make run` would do (`make -n -B`), on a machine whose nvidia-smi prints
    `nvidia_smi` (None: no nvidia-smi at all)."""
    bin_dir = tmp_path / ("gpu" if nvidia_smi else "no-gpu")
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\necho '{nvidia_smi}'\n")
        fake.chmod(0o755)
    others = [p for p in os.environ["PATH"].split(os.pathsep) if not Path(p, "nvidia-smi").exists()]
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "run", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHON", "BUILD", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")
        }
        | {"PATH": os.pathsep.join([str(bin_dir), *others])},
        check=True,
    )
    return done.stdout


def test_make_run_on_a_gpu_machine_serves_its_gpus_from_the_locked_gpu_build(tmp_path):
    gpu = make_run_plan(tmp_path, "GPU 0: NVIDIA L4 (UUID: GPU-0d4e)")
    assert ".venv-gpu/bin/python -m pip install" in gpu
    assert "-c constraints-gpu.txt -e '.[gpu]'" in gpu
    assert "constraints-cpu.txt" not in gpu and ".venv/" not in gpu  # never the CPU tree
    assert ".venv-gpu/bin/serviceai gpu-profile --output serve_config.gpu.yaml" in gpu
    assert gpu.rstrip().endswith(".venv-gpu/bin/serviceai run --config serve_config.gpu.yaml")

    cpu = make_run_plan(tmp_path, None)
    assert "-c constraints-cpu.txt -e '.[cpu,dev]'" in cpu and ".venv-gpu" not in cpu
    assert cpu.rstrip().endswith(".venv/bin/serviceai run")
    forced = make_run_plan(tmp_path, "GPU 0: NVIDIA L4 (UUID: GPU-0d4e)", "BUILD=cpu")
    assert forced.rstrip().endswith(".venv/bin/serviceai run") and ".venv-gpu" not in forced
