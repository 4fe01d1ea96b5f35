"""One machine's GPUs shared by the four model types: which model each serves, on which GPU, with
how much of its memory. `serviceai gpu-profile` writes the serve config (docs/configuration.md,
"One GPU machine").

A vLLM engine takes `gpu_memory_utilization` of its GPU's whole memory for its weights, its
activations and its KV cache, and refuses to start when that much is not free; engines that share
a GPU must leave room for each other. Each type needs its weights (two bytes a parameter), a KV
cache for `min_sequences` sequences of its whole context, and ENGINE_OVERHEAD_GIB (the CUDA
context, activations, sampler). Types go on GPUs largest first, each where the most room is left
(a type larger than one GPU takes whole GPUs, tensor-parallel); then each GPU's USABLE share is
split in proportion to need, so what is left becomes KV cache. Ray's fractional `num_gpus` is the
same share of the GPU, so any placement Ray makes keeps each GPU within USABLE.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployments.model_families import parsers_for

GIB = 1 << 30
USABLE = 0.95
"""Of each GPU's memory, what the engines on it may take together."""
ENGINE_OVERHEAD_GIB = 1.0
CARD_CLASSES_GIB = (22.0, 44.0, 78.0)
"""24, 48 and 80 GB cards as nvidia-smi reports them (an L4: 22.5 GiB, an L40S: 45 GiB, an H100:
79.6 GiB): the default models for the largest class a GPU reaches."""


class ProfileError(ValueError):
    """What does not fit, or what the profile cannot know, with what to change."""


@dataclass(frozen=True)
class ModelSpec:
    """A model's memory: its weights and its KV cache per token (bf16)."""

    model: str
    parameters: float
    """Billions."""
    kv_bytes_per_token: int
    max_model_len: int
    min_sequences: int = 2

    def need_gib(self) -> float:
        kv = self.kv_bytes_per_token * self.max_model_len * self.min_sequences
        return (self.parameters * 1e9 * 2 + kv) / GIB + ENGINE_OVERHEAD_GIB

    @classmethod
    def from_folder(cls, path: Path, max_model_len: int, min_sequences: int = 2) -> ModelSpec:
        """A local model's spec, read from its config.json and the size of its weights."""
        config = json.loads((path / "config.json").read_text())
        config = config.get("text_config", config)
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        kv_heads = config.get("num_key_value_heads", heads)
        per_token = 2 * config["num_hidden_layers"] * kv_heads * head_dim * 2
        weights = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        if not weights:
            raise ProfileError(f"{path}: no *.safetensors weights to size the model by")
        return cls(str(path), weights / 2e9, per_token, max_model_len, min_sequences)


def _qwen(
    name: str,
    billions: float,
    layers: int,
    kv_heads: int,
    context: int,
    sequences: int,
    *,
    head_dim: int = 128,
) -> ModelSpec:
    per_token = 2 * layers * kv_heads * head_dim * 2
    return ModelSpec(f"Qwen/{name}", billions, per_token, context, sequences)


DEFAULT_MODELS: dict[float, dict[str, ModelSpec]] = {
    # One L4, RTX 4090 or A10G: the four types side by side.
    22.0: {
        "ServiceAi-Fast": _qwen("Qwen2.5-0.5B-Instruct", 0.494, 24, 2, 8192, 4, head_dim=64),
        "ServiceAi-Pro": _qwen("Qwen3-4B", 4.02, 36, 8, 8192, 2),
        "ServiceAi-Coder": _qwen("Qwen2.5-Coder-1.5B-Instruct", 1.54, 28, 2, 8192, 4),
        "ServiceAi-Embed": _qwen("Qwen3-Embedding-0.6B", 0.596, 28, 8, 8192, 1),
    },
    # One L40S or RTX 6000 Ada.
    44.0: {
        "ServiceAi-Fast": _qwen("Qwen2.5-1.5B-Instruct", 1.54, 28, 2, 8192, 4),
        "ServiceAi-Pro": _qwen("Qwen3-8B", 8.19, 36, 8, 16384, 2),
        "ServiceAi-Coder": _qwen("Qwen2.5-Coder-3B-Instruct", 3.09, 36, 2, 16384, 2),
        "ServiceAi-Embed": _qwen("Qwen3-Embedding-0.6B", 0.596, 28, 8, 8192, 1),
    },
    # One H100 or A100 80GB.
    78.0: {
        "ServiceAi-Fast": _qwen("Qwen2.5-3B-Instruct", 3.09, 36, 2, 16384, 4),
        "ServiceAi-Pro": _qwen("Qwen3-14B", 14.8, 40, 8, 32768, 2),
        "ServiceAi-Coder": _qwen("Qwen2.5-Coder-7B-Instruct", 7.62, 28, 4, 32768, 4),
        "ServiceAi-Embed": _qwen("Qwen3-Embedding-0.6B", 0.596, 28, 8, 8192, 1),
    },
}
"""Each card class's default model per type (docs/configuration.md's table): bf16 weights, a
context each, KV for `min_sequences` whole contexts at least."""
MAX_NUM_SEQS = {
    "ServiceAi-Fast": 128,
    "ServiceAi-Pro": 32,
    "ServiceAi-Coder": 64,
    "ServiceAi-Embed": 256,
}


def default_models(gpu_memory_gib: float) -> dict[str, ModelSpec]:
    """The default models for the largest card class this GPU's memory reaches (below the
    smallest, the smallest's: the plan then names what does not fit)."""
    reached = [size for size in CARD_CLASSES_GIB if gpu_memory_gib >= size]
    return dict(DEFAULT_MODELS[reached[-1] if reached else CARD_CLASSES_GIB[0]])


@dataclass
class Placement:
    """Where one type runs: its GPUs (several: tensor-parallel) and its share of each."""

    name: str
    spec: ModelSpec
    gpus: list[int]
    share: float = 0.0
    """`gpu_memory_utilization`, and Ray's `num_gpus` per GPU as a fraction of USABLE."""


@dataclass
class GpuPlan:
    gpu_count: int
    gpu_memory_gib: float
    placements: list[Placement] = field(default_factory=list)

    def used(self, gpu: int) -> float:
        """The share of `gpu`'s memory that the engines on it take together."""
        return sum(p.share for p in self.placements if gpu in p.gpus)


def plan(models: dict[str, ModelSpec], gpu_count: int, gpu_memory_gib: float) -> GpuPlan:
    """Each type on GPUs, largest need first, each where the most room is left; a ProfileError
    naming what does not fit."""
    if gpu_count < 1:
        raise ProfileError("No GPU: the GPU profile needs at least one (make run serves on CPU).")
    usable = gpu_memory_gib * USABLE
    free = [usable] * gpu_count
    result = GpuPlan(gpu_count, gpu_memory_gib)
    for name, spec in sorted(models.items(), key=lambda item: -item[1].need_gib()):
        need = spec.need_gib()
        if need <= usable:
            gpu = max(range(gpu_count), key=lambda g: free[g])
            if need > free[gpu]:
                raise _no_room(name, spec, need, result, free)
            free[gpu] -= need
            result.placements.append(Placement(name, spec, [gpu]))
            continue
        width = 1 << math.ceil(math.log2(need / usable))  # tensor-parallel sizes are powers of 2
        empty = [g for g in range(gpu_count) if free[g] == usable][:width]
        if len(empty) < width:
            raise _no_room(name, spec, need, result, free)
        for gpu in empty:
            free[gpu] = 0.0
        result.placements.append(Placement(name, spec, empty))
    for placement in result.placements:
        gpus = placement.gpus
        if len(gpus) > 1:
            placement.share = USABLE
            continue
        sharing = [p for p in result.placements if p.gpus == gpus]
        total = sum(p.spec.need_gib() for p in sharing)
        placement.share = _floor(USABLE * placement.spec.need_gib() / total)
    return result


def _no_room(
    name: str, spec: ModelSpec, need: float, so_far: GpuPlan, free: list[float]
) -> ProfileError:
    placed = ", ".join(f"{p.name} {p.spec.need_gib():.1f}" for p in so_far.placements) or "none"
    return ProfileError(
        f"{name} ({spec.model}) needs {need:.1f} GiB (weights, a KV cache for "
        f"{spec.min_sequences} x {spec.max_model_len} tokens, {ENGINE_OVERHEAD_GIB:g} GiB for the "
        f"engine), and {max(free):.1f} GiB is left on the best of {so_far.gpu_count} GPU(s) of "
        f"{so_far.gpu_memory_gib:.1f} GiB (placed first, GiB: {placed}). Name a smaller model "
        "with its SERVICEAI_MODEL_* variable, or run it on a machine with more GPU memory."
    )


def model_type_entry(placement: Placement) -> dict[str, Any]:
    """A type's entry of a serve config's `model_types`, as the plan places it."""
    spec = placement.spec
    parsers = parsers_for(spec.model)
    engine_args: dict[str, Any] = {
        "max_model_len": spec.max_model_len,
        "max_num_seqs": MAX_NUM_SEQS.get(placement.name, 64),
        "gpu_memory_utilization": placement.share,
    }
    entry: dict[str, Any] = {
        "name": placement.name,
        "model": spec.model,
        "model_env": None,  # the profile sized this model: another needs the profile redone
        "num_replicas": 1,
        "num_cpus": 1,
        "num_gpus_per_shard": _floor(placement.share / USABLE),
        "tensor_parallel_size": len(placement.gpus),
        "max_ongoing_requests": engine_args["max_num_seqs"],
        "max_queued_requests": 256,
    }
    if parsers.embed:
        entry.update(task="embed", pooling="last", normalize=True)
    if parsers.tool_call_parser:
        entry["tool_call_parser"] = parsers.tool_call_parser
    if parsers.reasoning_parser:
        entry["reasoning_parser"] = parsers.reasoning_parser
    if parsers.think:
        start, end = parsers.think
        engine_args["reasoning_config"] = {"reasoning_start_str": start, "reasoning_end_str": end}
    entry["engine_args"] = engine_args
    return entry


def model_for(name: str, override: str | None, defaults: dict[str, ModelSpec]) -> ModelSpec:
    """The type's default model, or the one its SERVICEAI_MODEL_* variable names: a model of
    some card class's defaults, or a local folder the profile sizes (its context the
    default's)."""
    default = defaults[name]
    if not override:
        return default
    for models in DEFAULT_MODELS.values():
        for spec in models.values():
            if spec.model == override:
                return spec
    folder = Path(override).expanduser()
    if folder.is_dir():
        return ModelSpec.from_folder(folder, default.max_model_len, default.min_sequences)
    raise ProfileError(
        f"{override}: the profile cannot size a model it does not know. Download it first "
        f"(`hf download {override} --local-dir models/<name>`) and name the folder instead."
    )


def _floor(share: float) -> float:
    """Rounded down, so that shares that add up to a whole never exceed it."""
    return math.floor(share * 10_000) / 10_000
