"""What an operator writes for one model type, and its translation into Ray Serve options."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from deployments.catalog import LOGICAL_MODEL_TYPES
from deployments.model_families import UnknownFamily, parsers_for
from deployments.priority_gate import BUSY_STREAM_INTERVAL
from deployments.request_router import MAX_IMBALANCE
from deployments.wire import ADAPTER_NAME

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = "tiny"
"""The `model` value (also the default) that means: serve the generated tiny test model."""
"""Prefix-cache affinity bounded by load, stream feeds pinned (deployments.request_router)."""


def validate_autoscaling(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """Check an autoscaling_config with Ray Serve's own model, refusing unknown options."""
    if value is None:
        return None
    from ray.serve.config import AutoscalingConfig

    unknown = sorted(set(value) - set(AutoscalingConfig.model_fields))
    if unknown:
        raise ValueError(f"unknown autoscaling option(s) {unknown}")
    AutoscalingConfig(**value)
    return value


AutoscalingOptions = Annotated[dict[str, Any] | None, AfterValidator(validate_autoscaling)]
"""Ray Serve's `autoscaling_config`, checked by Ray's own model."""


def ray_accelerator_types() -> frozenset[str]:
    """The accelerator types Ray knows (ray.util.accelerators), as nodes advertise them."""
    from ray.util.accelerators import accelerators

    constants = vars(accelerators).items()
    return frozenset(v for name, v in constants if name.isupper() and isinstance(v, str))


# Set by the translation because they must agree with the Serve options: the name the
# ingress routes by, and the executor that uses the placement-group bundles Serve reserves.
_RESERVED_ENGINE_ARGS = frozenset(
    {
        "model",
        "tokenizer",
        "served_model_name",
        "tensor_parallel_size",
        "distributed_executor_backend",
        "runner",
        "convert",
    }
)


DEPLOYMENT_ONLY = frozenset(
    {
        "serving_processes",
        "autoscaling_config",
        "prefix_affinity",
        "max_imbalance",
        "env_vars",
        "health_check_period_s",
        "health_check_timeout_s",
        "graceful_shutdown_timeout_s",
        "max_surge_percent",
    }
)
"""A type's fields that only a deployment of its own honours: refused with `in_ingress`."""


ToolStrictLevel = Literal["auto", "function", "parameter"]
"""How strictly vLLM holds an automatic tool call to its schema."""


class AdapterConfig(BaseModel):
    """A LoRA adapter of a type's model, which clients call as `Type:name`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=ADAPTER_NAME)
    path: str = Field(description="A local folder in PEFT's format, or a Hugging Face id.")


class ModelTypeConfig(BaseModel):
    """One logical model type (e.g. ServiceAi-Fast): the concrete model, its engine, its replicas."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")
    description: str = Field("", description="Defaults to the catalog's (deployments.catalog).")
    model: str = Field(
        TINY_MODEL,
        description="Hugging Face id or local path; 'tiny' generates the test model, "
        "'tiny-long' its long-context variant, 'tiny-embed' an embedding one "
        "(deployments.tiny_model.VARIANTS). "
        "Overridden by the environment variable named in `model_env`.",
    )
    model_env: str | None = Field(
        None,
        description="Environment variable that, when set, replaces `model`. "
        "Defaults to the catalog's (deployments.catalog).",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Passed verbatim to vLLM's AsyncEngineArgs."
    )
    adapters: list[AdapterConfig] = Field(
        default_factory=list,
        description="LoRA adapters of the model, each served as `Type:name` (vLLM's "
        "enable_lora is then on; engine_args max_loras, max_lora_rank and max_cpu_loras size "
        "what an engine holds at once).",
    )
    task: Literal["generate", "embed"] = Field(
        "generate",
        description="'generate': the type serves chat, completions, responses and messages; "
        "'embed': /v1/embeddings alone, the model run as vLLM's pooling runner (an embedding "
        "model, or a causal LM whose last token's state is the vector, as Qwen3-Embedding's).",
    )
    pooling: Literal["last", "mean", "cls"] | None = Field(
        None,
        description="An embedding type's pooling of its tokens' states into one vector; "
        "default: the model's own (its sentence-transformers config), else vLLM's for its "
        "architecture.",
    )
    normalize: bool | None = Field(
        None,
        description="An embedding type's vectors scaled to length 1 (cosine similarity is "
        "then a dot product); default: the model's own, else yes.",
    )
    tensor_parallel_size: int = Field(1, ge=1, le=16)
    tool_call_parser: str | None = Field(
        None,
        description="vLLM's tool-call parser for this model (e.g. hermes for Qwen2.5); without one, "
        "an automatic tool choice is refused (400, param tool_choice) on every API; a forced "
        "one ('required', a named function) is served as JSON constrained to the schema.",
    )
    tool_strict_level: ToolStrictLevel = Field(
        "parameter",
        description="vLLM's constraint on tool calls: 'parameter' makes every call's arguments "
        "match its function's schema (as if each tool were strict), 'auto' only for strict tools.",
    )
    reasoning_parser: str | None = Field(
        None, description="vLLM's reasoning parser, for models that think before answering."
    )
    parsers_from_family: bool = Field(
        False,
        description="Take the parsers (and the strings around reasoning) from the model's family "
        "(deployments.model_families) instead of tool_call_parser and reasoning_parser; a model "
        "of no known family is refused when its engine starts. The Helm chart sets it for a "
        "type whose values name a model and no parsers.",
    )
    chat_template: str | None = Field(
        None, description="A chat template (file path or inline Jinja) replacing the model's own."
    )

    reserved_slots: int | None = Field(
        None,
        ge=0,
        description="With engine_args.scheduling_policy: priority, the engine slots (of "
        "max_num_seqs) that only requests of priority 0, the first plan's, may take "
        "(deployments.priority_gate). Default: an eighth, at least one.",
    )
    busy_stream_interval: int = Field(
        BUSY_STREAM_INTERVAL,
        ge=1,
        description="With engine_args.scheduling_policy: priority, a later plan's request that "
        "starts while the later plans fill every slot they may take streams its tokens this many "
        "a chunk (the first and the last at once), leaving the CPUs to the first plan "
        "(deployments.priority_gate). 1: token by token always.",
    )

    serving_processes: int = Field(
        1,
        ge=1,
        le=16,
        description="Processes that run vLLM's serving layer over each engine (as `vllm serve "
        "--api-server-count`): each a replica of the type's deployment, N of them gang-"
        "scheduled on one node over one engine core, the first launching it "
        "(deployments.serving_processes). Each reserves the type's num_cpus and 1/N of its "
        "GPU; num_replicas and autoscaling_config count engines, max_ongoing_requests is the "
        "engine's, split N ways. More lift the ceiling one Python process sets on a small "
        "model's throughput on a fast GPU.",
    )
    in_ingress: bool = Field(
        False,
        description="Run the type's engine in the ingress's own process, with no deployment "
        "of its own (app.serving.in_process): a token then crosses no process between the "
        "engine core and the client's connection, as in `vllm serve`. One machine's setup: "
        "one ingress replica, one engine, and no failover; the ingress reserves the type's "
        "num_cpus and GPU, and is replaced, with every type's requests it serves, when the "
        "engine dies.",
    )
    num_replicas: int | None = Field(None, ge=0)
    autoscaling_config: AutoscalingOptions = None
    max_ongoing_requests: int = Field(64, ge=1)
    prefix_affinity: bool = Field(
        True,
        description="Send each request to the replica most likely to hold its prompt's prefix "
        "in its cache (deployments.request_router); off: the power of two choices alone.",
    )
    max_imbalance: int = Field(
        MAX_IMBALANCE,
        ge=1,
        description="A replica that holds a prefix of the prompt is passed over when it runs "
        "this many more requests than the least busy replica (deployments.request_router).",
    )
    max_queued_requests: int = Field(-1, ge=-1)
    num_cpus: float = Field(1.0, ge=0)
    num_gpus_per_shard: float = Field(0, ge=0, le=1)
    accelerator_type: str | None = None
    env_vars: dict[str, str] = Field(default_factory=dict)
    health_check_period_s: float = Field(10.0, gt=0)
    health_check_timeout_s: float = Field(30.0, gt=0)
    graceful_shutdown_timeout_s: float = Field(
        20.0, ge=0, description="How long a stopping replica may finish its ongoing requests."
    )
    max_surge_percent: int = Field(
        0,
        ge=0,
        le=100,
        description="Extra replicas (percent of the target, rounded up) started during a rollout "
        "so that old replicas serve until their replacements are ready; 0 stops old ones first.",
    )

    @model_validator(mode="before")
    @classmethod
    def _catalog_defaults(cls, data: Any) -> Any:
        known = LOGICAL_MODEL_TYPES.get(str(data.get("name"))) if isinstance(data, dict) else None
        if known is None:
            return data
        return {"description": known.description, "model_env": known.model_env, **data}

    @field_validator("engine_args")
    @classmethod
    def _engine_args_are_ours_to_set(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = _RESERVED_ENGINE_ARGS & value.keys()
        if reserved:
            raise ValueError(
                f"set {sorted(reserved)} through the model type's own fields, not engine_args"
            )
        return value

    @field_validator("accelerator_type")
    @classmethod
    def _accelerator_known_to_ray(cls, value: str | None) -> str | None:
        # An unknown name is a resource no node offers: the replica would wait forever.
        if value is not None and value not in ray_accelerator_types():
            raise ValueError(
                f"unknown accelerator_type {value!r}; use a name from ray.util.accelerators "
                "(as Ray detects it on the node), e.g. L4, L40S, A10G, A100, H100"
            )
        return value

    @model_validator(mode="after")
    def _replicas_or_autoscaling(self) -> ModelTypeConfig:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set either num_replicas or autoscaling_config, not both")
        if self.accelerator_type and not self.num_gpus_per_shard:
            raise ValueError("accelerator_type needs num_gpus_per_shard > 0")
        if self.tensor_parallel_size > 1 and self.num_gpus_per_shard != 1:
            raise ValueError("tensor_parallel_size > 1 needs num_gpus_per_shard: 1")
        if self.task == "embed":
            generating = [
                name
                for name in ("tool_call_parser", "reasoning_parser", "chat_template")
                if getattr(self, name) is not None
            ]
            if generating:
                raise ValueError(f"an embedding type (task: embed) generates nothing: {generating}")
            if self.adapters:
                raise ValueError("adapters are served on a type that generates (task: generate)")
        elif self.pooling is not None or self.normalize is not None:
            raise ValueError("pooling and normalize need task: embed")
        names = [adapter.name for adapter in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"adapter names must differ: {names}")
        if self.in_ingress:
            for_a_deployment = sorted(DEPLOYMENT_ONLY & self.model_fields_set)
            if for_a_deployment or self.num_replicas not in (None, 1):
                raise ValueError(
                    "in_ingress: the engine runs in the ingress's one replica, with no "
                    f"deployment of its own; remove {for_a_deployment or ['num_replicas']}"
                )
            if self.tensor_parallel_size > 1:
                raise ValueError("in_ingress serves one engine shard: tensor_parallel_size 1")
        if self.serving_processes > 1:
            if not self.num_cpus:
                # A gang's members are placed as a placement group, whose bundles may not be empty.
                raise ValueError("serving_processes > 1 needs num_cpus > 0")
            if self.tensor_parallel_size > 1:
                raise ValueError(
                    "serving_processes > 1 serves an engine of one shard (tensor_parallel_size 1): "
                    "a gang's members reserve alike, and a sharded engine's GPUs must be one "
                    "replica's placement group"
                )
        max_num_seqs = self.engine_args.get("max_num_seqs")
        if (
            isinstance(max_num_seqs, int)
            and self.max_ongoing_requests > max_num_seqs
            and self.engine_args.get("scheduling_policy") != "priority"
        ):
            # Serve would hand the replica requests the engine can only park in its own queue,
            # where a replica started meanwhile cannot take them over. Under priority
            # scheduling that queue is the point: it is ordered by plan (priority_gate).
            raise ValueError(
                f"max_ongoing_requests ({self.max_ongoing_requests}) exceeds the engine's "
                f"max_num_seqs ({max_num_seqs})"
            )
        return self

    def ingress_resources(self) -> dict[str, Any]:
        """What the ingress's replica reserves beside its own for this type's engine, where
        the engine runs there (`in_ingress`)."""
        if not self.in_ingress:
            return {}
        resources: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.num_gpus_per_shard:
            resources["num_gpus"] = self.num_gpus_per_shard
        if self.accelerator_type:
            resources["accelerator_type"] = self.accelerator_type
        return resources

    def adapter_paths(self) -> dict[str, str]:
        """Each adapter's path by the name clients call it (`Type:name`)."""
        return {f"{self.name}:{adapter.name}": adapter.path for adapter in self.adapters}

    def resolved_model(self, environ: Mapping[str, str] | None = None) -> str:
        """The concrete model: the override from `model_env` if set, else `model`."""
        found = (os.environ if environ is None else environ).get(self.model_env or "")
        if self.model_env and found:
            return found
        return self.model

    def as_run(self, environ: Mapping[str, str] | None = None) -> ModelTypeConfig:
        """The type as its engine runs it: where `model_env` names another model, that model
        with its family's parsers (deployments.model_families), never those configured for the
        model it replaces; the same where `parsers_from_family` asks for them; a family unknown
        there is refused, naming what to set instead."""
        model = self.resolved_model(environ)
        if model == self.model and not self.parsers_from_family:
            return self
        if self.task == "embed":
            return self.model_copy(update={"model": model})
        try:
            parsers = parsers_for(model)
        except UnknownFamily as exc:
            named_by = f"{self.model_env} names" if model != self.model else f"{self.name}'s model"
            raise UnknownFamily(f"{named_by} {exc}") from None
        engine_args = {k: v for k, v in self.engine_args.items() if k != "reasoning_config"}
        if parsers.think is not None:
            start, end = parsers.think
            engine_args["reasoning_config"] = {
                "reasoning_start_str": start,
                "reasoning_end_str": end,
            }
        return self.model_copy(
            update={
                "model": model,
                "tool_call_parser": parsers.tool_call_parser,
                "reasoning_parser": parsers.reasoning_parser,
                "engine_args": engine_args,
            }
        )


def tiny_model_dir() -> Path:
    """Where the generated test model lives (SERVICEAI_TINY_MODEL_DIR, else ./models/tiny)."""
    return Path(os.environ.get("SERVICEAI_TINY_MODEL_DIR", PROJECT_ROOT / "models" / "tiny"))


def generated_model(model: str) -> Path | None:
    """The folder of a generated model (`tiny`, `tiny-long`), made here unless it is already
    there; None for any other model (a path or a Hugging Face id)."""
    from deployments.tiny_model import VARIANTS, ensure

    if model not in VARIANTS:
        return None
    folder = tiny_model_dir() if model == TINY_MODEL else tiny_model_dir().parent / model
    return ensure(folder, model)
