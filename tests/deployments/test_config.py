import pytest
from pydantic import ValidationError

from deployments.config import TINY_MODEL, ModelTypeConfig


def gpu_type(**fields) -> ModelTypeConfig:
    return ModelTypeConfig.model_validate(
        {"name": "ServiceAi-Pro", "model": "org/model", "num_gpus_per_shard": 1, "accelerator_type": "A100", **fields}
    )


def test_cpu_defaults():
    options = ModelTypeConfig(name="ServiceAi-Fast", num_cpus=0.5).serve_options()
    assert options == {
        "name": "ServiceAi-Fast",
        "max_ongoing_requests": 64,
        "max_queued_requests": -1,
        "health_check_period_s": 10.0,
        "health_check_timeout_s": 30.0,
        "graceful_shutdown_timeout_s": 20.0,
        "ray_actor_options": {"num_cpus": 0.5},
        "num_replicas": 1,
    }


def test_one_gpu_replica_is_pinned_to_its_accelerator():
    options = gpu_type(
        autoscaling_config={"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 32},
        max_ongoing_requests=128,
        max_queued_requests=512,
        env_vars={"VLLM_LOGGING_LEVEL": "WARNING"},
    ).serve_options()
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
    options = config.serve_options()
    assert options["placement_group_strategy"] == "STRICT_PACK"
    assert options["placement_group_bundles"] == [
        {"GPU": 1.0, "accelerator_type:A100": 0.001, "CPU": 2},
        {"GPU": 1.0, "accelerator_type:A100": 0.001},
        {"GPU": 1.0, "accelerator_type:A100": 0.001},
        {"GPU": 1.0, "accelerator_type:A100": 0.001},
    ]
    # The replica sits in bundle 0 without a GPU of its own; vLLM's Ray workers take the GPUs.
    assert options["ray_actor_options"] == {"num_cpus": 2}
    kwargs = config.engine_kwargs("/models/x")
    assert kwargs["tensor_parallel_size"] == 4
    assert kwargs["distributed_executor_backend"] == "ray"


def test_engine_kwargs_name_the_logical_type_only():
    kwargs = ModelTypeConfig(name="ServiceAi-Coder", engine_args={"max_model_len": 4096}).engine_kwargs("/m")
    assert kwargs == {
        "model": "/m",
        "tokenizer": "/m",
        "served_model_name": ["ServiceAi-Coder"],
        "tensor_parallel_size": 1,
        "max_model_len": 4096,
    }


def test_model_env_overrides_the_model():
    config = ModelTypeConfig(name="ServiceAi-Fast", model_env="SERVICEAI_MODEL_FAST")
    assert config.resolved_model({}) == TINY_MODEL
    assert config.resolved_model({"SERVICEAI_MODEL_FAST": "Qwen/Qwen2.5-0.5B-Instruct"}) == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"num_replicas": 2, "autoscaling_config": {"min_replicas": 1}}, "either num_replicas or autoscaling_config"),
        ({"autoscaling_config": {"min_replicas": 3, "max_replicas": 1}}, "autoscaling_config"),
        ({"autoscaling_config": {"no_such_option": 1}}, "no_such_option"),
        ({"engine_args": {"model": "x"}}, "engine_args"),
        ({"accelerator_type": "L4"}, "num_gpus_per_shard"),
        ({"tensor_parallel_size": 2}, "num_gpus_per_shard: 1"),
        ({"max_ongoing_requests": 0}, "max_ongoing_requests"),
        ({"surprise": True}, "surprise"),
        ({"name": "has space"}, "name"),
    ],
)
def test_bad_config_names_the_field(fields, fragment):
    with pytest.raises(ValidationError) as info:
        ModelTypeConfig.model_validate({"name": "ServiceAi-Fast", **fields})
    assert fragment in str(info.value)
