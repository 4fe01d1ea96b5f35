"""`serviceai gpu-profile`: a serve config for this machine's GPUs (deployments.gpu_profile), the
local profile's ingress and plans with each model type placed on the GPUs present."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import typer
import yaml

from app.config.settings import PROJECT_ROOT
from deployments.catalog import LOGICAL_MODEL_TYPES
from deployments.gpu_profile import (
    GpuPlan,
    ProfileError,
    default_models,
    model_for,
    model_type_entry,
    plan,
)
from deployments.model_families import UnknownFamily

LOCAL_PROFILE = PROJECT_ROOT / "serve_config.yaml"
HEADER = """\
# ServiceAi on this machine's GPUs, written by `serviceai gpu-profile` (deployments/gpu_profile.py)
# for {gpus} GPU(s) of {memory:.1f} GiB. The local profile's ingress and plans; each model type's
# model, GPU share (gpu_memory_utilization, and Ray's num_gpus) and parsers from the profile.
# Run it with `serviceai run --config {path}`; write it again after changing a model.
"""


def detected_gpus() -> tuple[int, float]:
    """This machine's GPU count and the smallest one's memory in GiB (nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        raise ProfileError("nvidia-smi is not here: give --gpus and --gpu-memory-gib.")
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not listed:
        raise ProfileError("nvidia-smi lists no GPU.")
    return len(listed), min(float(mib) for mib in listed) / 1024


def machine_plan(gpus: int, memory_gib: float) -> GpuPlan:
    """The plan for these GPUs, with each type's model from its SERVICEAI_MODEL_* variable
    where set."""
    defaults = default_models(memory_gib)
    models = {
        name: model_for(name, os.environ.get(LOGICAL_MODEL_TYPES[name].model_env), defaults)
        for name in defaults
    }
    return plan(models, gpus, memory_gib)


def serve_config(placed: GpuPlan) -> dict:
    """The local profile with the plan's model types, in the catalog's order."""
    config = yaml.safe_load(LOCAL_PROFILE.read_text())
    order = list(LOGICAL_MODEL_TYPES)
    entries = sorted(placed.placements, key=lambda p: order.index(p.name))
    config["applications"][0]["args"]["model_types"] = [model_type_entry(p) for p in entries]
    return config


def gpu_profile(
    gpus: int | None = typer.Option(None, help="GPUs to use (default: all nvidia-smi lists)."),
    gpu_memory_gib: float | None = typer.Option(
        None, help="Memory of each GPU in GiB (default: the smallest nvidia-smi lists)."
    ),
    output: Path = typer.Option(PROJECT_ROOT / "serve_config.gpu.yaml", help="Where to write."),
) -> None:
    """Write a serve config that places the four model types on this machine's GPUs."""
    try:
        if gpus is None or gpu_memory_gib is None:
            found, memory = detected_gpus()
            gpus = found if gpus is None else gpus
            gpu_memory_gib = memory if gpu_memory_gib is None else gpu_memory_gib
        placed = machine_plan(gpus, gpu_memory_gib)
        config = serve_config(placed)
    except (ProfileError, UnknownFamily) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    header = HEADER.format(gpus=gpus, memory=gpu_memory_gib, path=output.name)
    output.write_text(header + yaml.safe_dump(config, sort_keys=False, width=100))
    for placement in placed.placements:
        typer.echo(
            f"{placement.name:16} {placement.spec.model:40} GPU {','.join(map(str, placement.gpus)):5}"
            f" {placement.share:.0%} of its memory"
        )
    typer.echo(f"wrote {output}: serviceai run --config {output}")
