import pytest
from pydantic import ValidationError
from ray.serve.config import RequestRouterConfig

from deployments.catalog import LOGICAL_MODEL_TYPES
from deployments.deployment_options import REQUEST_ROUTER, engine_kwargs, serve_options
from deployments.model_families import UnknownFamily
from deployments.model_server import ModelServer
from deployments.model_type import TINY_MODEL, ModelTypeConfig, ray_accelerator_types


def gpu_type(**fields) -> ModelTypeConfig:
    return ModelTypeConfig.model_validate(
        {
            "name": "ServiceAi-Pro",
            "model": "org/model",
            "num_gpus_per_shard": 1,
            "accelerator_type": "A100",
            **fields,
        }
    )


def test_cpu_defaults():
    options = serve_options(ModelTypeConfig(name="ServiceAi-Fast", num_cpus=0.5))
    assert options == {
        "name": "ServiceAi-Fast",
        "max_ongoing_requests": 64,
        "max_queued_requests": -1,
        "health_check_period_s": 10.0,
        "health_check_timeout_s": 30.0,
        "graceful_shutdown_timeout_s": 20.0,
        "max_surge_percent": 0,
        "ray_actor_options": {"num_cpus": 0.5},
        "num_replicas": 1,
        "request_router_config": RequestRouterConfig(
            request_router_class=REQUEST_ROUTER,
            request_router_kwargs={
                "model_type": "ServiceAi-Fast",
                "prefix_affinity": True,
                "max_imbalance": 8,
            },
        ),
    }


def test_one_gpu_replica_is_pinned_to_its_accelerator():
    options = serve_options(
        gpu_type(
            autoscaling_config={
                "min_replicas": 1,
                "max_replicas": 8,
                "target_ongoing_requests": 32,
            },
            max_ongoing_requests=128,
            max_queued_requests=512,
            env_vars={"VLLM_LOGGING_LEVEL": "WARNING"},
        )
    )
    assert options["ray_actor_options"] == {
        "num_cpus": 1.0,
        "num_gpus": 1,
        "accelerator_type": "A100",
        "runtime_env": {"env_vars": {"VLLM_LOGGING_LEVEL": "WARNING"}},
    }
    assert options["autoscaling_config"]["max_replicas"] == 8
    assert "num_replicas" not in options
    assert (options["max_ongoing_requests"], options["max_queued_requests"]) == (128, 512)
    assert "placement_group_bundles" not in options


def test_tensor_parallel_uses_one_gpu_bundle_per_shard_on_one_node():
    config = gpu_type(tensor_parallel_size=4, num_cpus=2)
    options = serve_options(config)
    assert options["placement_group_strategy"] == "STRICT_PACK"
    assert options["placement_group_bundles"] == [
        {"GPU": 1.0, "accelerator_type:A100": 0.001, "CPU": 2},
        {"GPU": 1.0, "accelerator_type:A100": 0.001},
        {"GPU": 1.0, "accelerator_type:A100": 0.001},
        {"GPU": 1.0, "accelerator_type:A100": 0.001},
    ]
    # The replica sits in bundle 0 without a GPU of its own; vLLM's Ray workers take the GPUs.
    assert options["ray_actor_options"] == {"num_cpus": 2}
    kwargs = engine_kwargs(config, "/models/x")
    assert kwargs["tensor_parallel_size"] == 4
    assert kwargs["distributed_executor_backend"] == "ray"


def test_serving_processes_are_a_gang_of_replicas_each_with_its_share_of_the_gpu():
    config = gpu_type(serving_processes=4, num_cpus=2, max_ongoing_requests=30, num_replicas=2)
    options = serve_options(config)
    assert options["gang_scheduling_config"] == {"gang_size": 4, "gang_placement_strategy": "PACK"}
    # Engines are counted in gangs: two engines are eight replicas, each a quarter of a GPU
    # and a quarter of the engine's requests (rounded up).
    assert options["num_replicas"] == 8
    assert options["max_ongoing_requests"] == 8
    assert options["ray_actor_options"]["num_gpus"] == 0.25
    assert "placement_group_bundles" not in options
    replica = ModelServer.options(**options)._replica_config
    assert replica.resource_dict == {"CPU": 2.0, "GPU": 0.25, "accelerator_type:A100": 0.001}
    scaled = serve_options(
        gpu_type(
            serving_processes=2,
            autoscaling_config={"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 8},
        )
    )
    assert scaled["autoscaling_config"] == {
        "min_replicas": 2,
        "max_replicas": 6,
        "target_ongoing_requests": 4,
    }
    ModelServer.options(**scaled)  # Serve takes the gang with autoscaling


def test_serving_processes_serve_an_engine_of_one_shard():
    with pytest.raises(ValidationError, match="tensor_parallel_size 1"):
        gpu_type(tensor_parallel_size=2, serving_processes=2)


def test_serving_processes_need_cpus_of_the_replica():
    with pytest.raises(ValidationError, match="serving_processes > 1 needs num_cpus > 0"):
        ModelTypeConfig(name="ServiceAi-Fast", serving_processes=2, num_cpus=0)


def test_ray_serve_accepts_the_options_and_translates_the_accelerator_as_nodes_advertise_it():
    one_gpu = ModelServer.options(**serve_options(gpu_type(accelerator_type="L4")))
    # Ray's own translation: the resource an L4 node offers as accelerator_type:L4.
    assert one_gpu._replica_config.resource_dict == {
        "CPU": 1.0,
        "GPU": 1.0,
        "accelerator_type:L4": 0.001,
    }

    sharded = ModelServer.options(**serve_options(gpu_type(tensor_parallel_size=2, num_cpus=4)))
    # Serve checked that the replica fits bundle 0, where it pins the replica.
    assert sharded._replica_config.resource_dict == {"CPU": 4.0}
    assert sharded._replica_config.placement_group_bundles[0]["CPU"] == 4.0


def test_rollout_surge_and_drain_time_reach_serve():
    options = serve_options(gpu_type(max_surge_percent=25, graceful_shutdown_timeout_s=600))
    deployment = ModelServer.options(**options)
    assert deployment._deployment_config.max_surge_percent == 25
    assert deployment._deployment_config.graceful_shutdown_timeout_s == 600


def test_catalog_types_get_their_description_and_override_variable():
    for known in LOGICAL_MODEL_TYPES.values():
        config = ModelTypeConfig(name=known.name)
        assert (config.description, config.model_env) == (known.description, known.model_env)
    # What a config says wins: production turns the environment override off.
    assert ModelTypeConfig(name="ServiceAi-Pro", model_env=None).model_env is None
    assert ModelTypeConfig(name="ServiceAi-Vision").model_env is None


def test_accelerator_types_are_the_ones_ray_knows():
    assert {"L4", "L40S", "A10G", "A100", "H100"} <= ray_accelerator_types()


def test_engine_kwargs_name_the_logical_type_only():
    kwargs = engine_kwargs(
        ModelTypeConfig(name="ServiceAi-Coder", engine_args={"max_model_len": 4096}), "/m"
    )
    assert kwargs == {
        "model": "/m",
        "tokenizer": "/m",
        "served_model_name": ["ServiceAi-Coder"],
        "tensor_parallel_size": 1,
        "max_model_len": 4096,
        "enable_prefix_caching": True,
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }


def test_engine_args_override_the_engine_defaults():
    kwargs = engine_kwargs(
        ModelTypeConfig(name="ServiceAi-Fast", engine_args={"enable_prefix_caching": False}), "/m"
    )
    assert kwargs["enable_prefix_caching"] is False


def test_model_env_overrides_the_model():
    config = ModelTypeConfig(name="ServiceAi-Fast", model_env="SERVICEAI_MODEL_FAST")
    assert config.resolved_model({}) == TINY_MODEL
    assert (
        config.resolved_model({"SERVICEAI_MODEL_FAST": "Qwen/Qwen2.5-0.5B-Instruct"})
        == "Qwen/Qwen2.5-0.5B-Instruct"
    )


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        (
            {"num_replicas": 2, "autoscaling_config": {"min_replicas": 1}},
            "either num_replicas or autoscaling_config",
        ),
        ({"autoscaling_config": {"min_replicas": 3, "max_replicas": 1}}, "autoscaling_config"),
        ({"autoscaling_config": {"no_such_option": 1}}, "no_such_option"),
        ({"engine_args": {"model": "x"}}, "engine_args"),
        ({"accelerator_type": "L4"}, "num_gpus_per_shard"),
        ({"accelerator_type": "A10", "num_gpus_per_shard": 1}, "unknown accelerator_type 'A10'"),
        ({"engine_args": {"distributed_executor_backend": "mp"}}, "distributed_executor_backend"),
        (
            {"max_ongoing_requests": 65, "engine_args": {"max_num_seqs": 64}},
            "exceeds the engine's max_num_seqs",
        ),
        ({"max_surge_percent": 101}, "max_surge_percent"),
        ({"tensor_parallel_size": 2}, "num_gpus_per_shard: 1"),
        ({"max_ongoing_requests": 0}, "max_ongoing_requests"),
        ({"surprise": True}, "surprise"),
        ({"name": "has space"}, "name"),
        ({"task": "embed", "tool_call_parser": "hermes"}, "generates nothing"),
        ({"task": "embed", "adapters": [{"name": "a", "path": "/a"}]}, "adapters are served"),
        ({"pooling": "mean"}, "pooling and normalize need task: embed"),
        ({"adapters": [{"name": "a", "path": "/a"}, {"name": "a", "path": "/b"}]}, "differ"),
        ({"adapters": [{"name": "a:b", "path": "/a"}]}, "name"),
        ({"engine_args": {"runner": "pooling"}}, "engine_args"),
    ],
)
def test_bad_config_names_the_field(fields, fragment):
    with pytest.raises(ValidationError) as info:
        ModelTypeConfig.model_validate({"name": "ServiceAi-Fast", **fields})
    assert fragment in str(info.value)


def test_an_embedding_type_runs_the_pooling_runner_with_its_pooling():
    config = ModelTypeConfig.model_validate(
        {"name": "ServiceAi-Embed", "task": "embed", "pooling": "mean", "normalize": False}
    )
    kwargs = engine_kwargs(config, "/m")
    assert kwargs["runner"] == "pooling"
    assert kwargs["pooler_config"] == {"pooling_type": "MEAN", "use_activation": False}
    plain = ModelTypeConfig.model_validate({"name": "ServiceAi-Embed", "task": "embed"})
    assert "pooler_config" not in engine_kwargs(plain, "/m")  # the model's own


def test_adapters_turn_lora_on_and_are_served_as_type_colon_name():
    config = ModelTypeConfig.model_validate(
        {
            "name": "ServiceAi-Coder",
            "adapters": [{"name": "acme-sql", "path": "/adapters/acme"}],
            "engine_args": {"max_loras": 4},
        }
    )
    assert config.adapter_paths() == {"ServiceAi-Coder:acme-sql": "/adapters/acme"}
    kwargs = engine_kwargs(config, "/m")
    assert kwargs["enable_lora"] is True and kwargs["max_loras"] == 4
    assert "enable_lora" not in engine_kwargs(ModelTypeConfig(name="ServiceAi-Fast"), "/m")


def test_a_model_named_by_the_types_variable_runs_with_its_familys_parsers():
    """The local profile's Pro reads the tiny model's reasoning as deepseek_v3 does; a real
    Qwen3 named by SERVICEAI_MODEL_PRO gets Qwen3's parsers, not the tiny model's."""
    pro = ModelTypeConfig(
        name="ServiceAi-Pro",
        model="tiny",
        tool_call_parser=None,
        reasoning_parser="deepseek_v3",
        engine_args={"max_model_len": 2048, "reasoning_config": {"reasoning_start_str": "<x>"}},
    )

    running = pro.as_run({"SERVICEAI_MODEL_PRO": "Qwen/Qwen3-8B"})

    assert (running.model, running.tool_call_parser, running.reasoning_parser) == (
        "Qwen/Qwen3-8B",
        "hermes",
        "qwen3",
    )
    assert running.engine_args == {
        "max_model_len": 2048,
        "reasoning_config": {"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"},
    }
    assert pro.as_run({}) is pro  # the configured model keeps the configured parsers
    coder = ModelTypeConfig(name="ServiceAi-Coder", model="tiny")
    assert coder.as_run({"SERVICEAI_MODEL_CODER": "Qwen/Qwen2.5-Coder-7B-Instruct"}).model_dump(
        include={"tool_call_parser", "reasoning_parser"}
    ) == {"tool_call_parser": "hermes", "reasoning_parser": None}


def test_a_model_of_an_unknown_family_is_refused_naming_what_to_set():
    pro = ModelTypeConfig(name="ServiceAi-Pro", model="tiny", reasoning_parser="deepseek_v3")

    with pytest.raises(UnknownFamily) as refused:
        pro.as_run({"SERVICEAI_MODEL_PRO": "acme/mystery-7b"})

    message = str(refused.value)
    assert message.startswith("SERVICEAI_MODEL_PRO names acme/mystery-7b")
    assert "tool_call_parser and reasoning_parser" in message


def test_a_type_may_take_its_configured_models_parsers_from_the_family():
    """What the Helm chart renders for a type whose values name a model and no parsers."""
    pro = ModelTypeConfig(
        name="ServiceAi-Pro",
        model="Qwen/Qwen3-32B",
        model_env=None,
        tool_call_parser="mistral",
        parsers_from_family=True,
    )

    running = pro.as_run({})

    assert (running.model, running.tool_call_parser, running.reasoning_parser) == (
        "Qwen/Qwen3-32B",
        "hermes",
        "qwen3",
    )
    assert running.engine_args["reasoning_config"]["reasoning_end_str"] == "</think>"
    mystery = pro.model_copy(update={"model": "acme/mystery-7b"})
    with pytest.raises(UnknownFamily, match="^ServiceAi-Pro's model acme/mystery-7b: its"):
        mystery.as_run({})


def test_an_embedding_type_takes_the_model_it_is_pointed_at_as_it_is():
    embed = ModelTypeConfig(name="ServiceAi-Embed", model="tiny-embed", task="embed")
    running = embed.as_run({"SERVICEAI_MODEL_EMBED": "acme/any-embedder"})
    assert (running.model, running.task) == ("acme/any-embedder", "embed")
