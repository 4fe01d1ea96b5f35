"""What Ray Serve and vLLM get for a model type (deployments.model_type): the deployment's
options (resources, autoscaling, the request router, a tensor-parallel replica's placement group,
a gang of serving processes) and the engine's arguments."""

from __future__ import annotations

from typing import Any

from deployments.model_type import ModelTypeConfig

REQUEST_ROUTER = "deployments.request_router:ServiceRouter"

ENGINE_DEFAULTS: dict[str, Any] = {
    # Repeated prefixes (system prompts, agent turns) skip prefill: usage reports cached_tokens.
    "enable_prefix_caching": True,
    # Structured outputs without free whitespace: a weak model cannot pad JSON up to max_tokens.
    "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
}
"""What every type's engine gets unless its engine_args say otherwise."""


def serve_options(config: ModelTypeConfig) -> dict[str, Any]:
    """Keyword arguments for `Deployment.options()` of this model type's deployment."""
    from ray.serve.config import RequestRouterConfig

    actor_options: dict[str, Any] = {"num_cpus": config.num_cpus}
    if config.env_vars:
        actor_options["runtime_env"] = {"env_vars": dict(config.env_vars)}
    options: dict[str, Any] = {
        "name": config.name,
        "max_ongoing_requests": config.max_ongoing_requests,
        "max_queued_requests": config.max_queued_requests,
        "health_check_period_s": config.health_check_period_s,
        "health_check_timeout_s": config.health_check_timeout_s,
        "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
        "max_surge_percent": config.max_surge_percent,
        "ray_actor_options": actor_options,
        "request_router_config": RequestRouterConfig(
            # Ray's field takes the class's import path (it imports it in each router).
            request_router_class=REQUEST_ROUTER,  # type: ignore[arg-type]
            request_router_kwargs={
                "model_type": config.name,
                "prefix_affinity": config.prefix_affinity,
                "max_imbalance": config.max_imbalance,
            },
        ),
    }
    if config.autoscaling_config is not None:
        options["autoscaling_config"] = dict(config.autoscaling_config)
    else:
        options["num_replicas"] = 1 if config.num_replicas is None else config.num_replicas
    if config.tensor_parallel_size == 1:
        if config.num_gpus_per_shard:
            actor_options["num_gpus"] = config.num_gpus_per_shard
        if config.accelerator_type:
            actor_options["accelerator_type"] = config.accelerator_type
    if config.serving_processes > 1:
        return gang_options(config, options)
    if config.tensor_parallel_size > 1:
        # vLLM's Ray executor starts one worker (1 GPU, 0 CPU) in each bundle that has a GPU;
        # Serve pins the replica, which then holds no GPU, to bundle 0. STRICT_PACK keeps a
        # replica on one node: tensor parallelism needs NVLink.
        options["placement_group_bundles"] = bundles(config)
        options["placement_group_strategy"] = "STRICT_PACK"
    return options


def bundles(config: ModelTypeConfig) -> list[dict[str, float]]:
    """One bundle per shard, each with its GPU; the first with the replica's CPUs."""
    shard: dict[str, float] = {"GPU": 1.0}
    if config.accelerator_type:
        shard[f"accelerator_type:{config.accelerator_type}"] = 0.001
    bundles = [dict(shard) for _ in range(config.tensor_parallel_size)]
    bundles[0]["CPU"] = config.num_cpus
    return bundles


def gang_options(config: ModelTypeConfig, options: dict[str, Any]) -> dict[str, Any]:
    """`options` for a gang of `serving_processes` replicas per engine: the engine's
    replicas, autoscaling bounds and request limit counted in members, each member with its
    share of the GPU (deployments.serving_processes checks that they share one)."""
    n = config.serving_processes
    options["gang_scheduling_config"] = {"gang_size": n, "gang_placement_strategy": "PACK"}
    options["max_ongoing_requests"] = -(-config.max_ongoing_requests // n)
    if "num_replicas" in options:
        options["num_replicas"] *= n
    scaling = options.get("autoscaling_config")
    if scaling is not None:
        for bound in ("min_replicas", "initial_replicas", "max_replicas"):
            if scaling.get(bound) is not None:
                scaling[bound] *= n
        if "target_ongoing_requests" in scaling:
            scaling["target_ongoing_requests"] /= n
    if config.num_gpus_per_shard:
        options["ray_actor_options"]["num_gpus"] = config.num_gpus_per_shard / n
    return options


def engine_kwargs(config: ModelTypeConfig, model_path: str) -> dict[str, Any]:
    """Keyword arguments for vLLM's AsyncEngineArgs."""
    kwargs: dict[str, Any] = {
        **ENGINE_DEFAULTS,
        "model": model_path,
        "tokenizer": model_path,
        "served_model_name": [config.name],
        "tensor_parallel_size": config.tensor_parallel_size,
        **config.engine_args,
    }
    if config.adapters:
        kwargs.setdefault("enable_lora", True)
    if config.task == "embed":
        kwargs["runner"] = "pooling"
        pooler = dict(kwargs.get("pooler_config") or {})
        if config.pooling is not None:
            pooler["pooling_type"] = config.pooling.upper()
        if config.normalize is not None:
            pooler["use_activation"] = config.normalize
        if pooler:
            kwargs["pooler_config"] = pooler
    if config.tensor_parallel_size > 1:
        # Left to itself vLLM counts the GPUs this replica sees (none: they are in the
        # bundles) and refuses; the Ray executor uses the bundles instead.
        kwargs["distributed_executor_backend"] = "ray"
    return kwargs
