"""The serve configs: accepted by Ray Serve, buildable without GPUs, and placeable on cluster.yaml.

The production config is built the way the Serve controller builds it (schema, import_path,
builder, Serve's own option validation), then held against the cluster's node types.
"""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys

import pytest
from ray._common.ray_option_utils import validate_actor_options
from ray.serve._private.deploy_utils import get_app_code_version
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema
from ray.util.placement_group import validate_placement_group

from deployments.catalog import LOGICAL_MODEL_TYPES
from deployments.deployment_options import engine_kwargs
from deployments.model_type import ModelTypeConfig, ray_accelerator_types
from tests.conftest import PROJECT_ROOT
from tests.deploy.conftest import (
    LOCAL_SERVE_CONFIG,
    PRODUCTION_SERVE_CONFIG,
    SIZING_GUIDE,
    build_serve_config,
    load,
)

SECRET_REFERENCE = re.compile(r"^\$\{[A-Z0-9_]+\}$")


def applications(config: dict) -> dict[str, dict]:
    return {app["name"]: app for app in config["applications"]}


def ingress_args(config: dict) -> dict:
    apps = config["applications"]
    return next(a for a in apps if a["import_path"] == "app.builder:build_app")["args"]


def model_types(config: dict) -> list[dict]:
    """The entry of each model type the ingress serves: the args of the type's own application
    where it has one (production: the ingress names it only), else the ingress's entry."""
    args = ingress_args(config)
    if not args.get("separate_model_apps"):
        return args["model_types"]
    apps = applications(config)
    return [apps[name]["args"] for name in args["model_types"]]


def node_type_for(demand: dict[str, float], cluster: dict) -> list[str]:
    """The worker node types on which one replica with this demand fits."""
    return [
        name
        for name, node_type in cluster["available_node_types"].items()
        if name != cluster["head_node_type"]
        and all(node_type["resources"].get(r, 0) >= amount for r, amount in demand.items())
    ]


def replicas_per_node(demand: dict[str, float], resources: dict[str, float]) -> int:
    return min(math.floor(resources[r] / amount + 1e-9) for r, amount in demand.items())


BOTH_PROFILES = pytest.mark.parametrize(
    "path", [LOCAL_SERVE_CONFIG, PRODUCTION_SERVE_CONFIG], ids=lambda p: p.name
)


@BOTH_PROFILES
def test_passes_ray_serve_deploy_schema(path):
    ServeDeploySchema.model_validate(load(path))


@BOTH_PROFILES
def test_both_profiles_serve_the_catalog_types(path):
    assert [m["name"] for m in model_types(load(path))] == list(LOGICAL_MODEL_TYPES)


def test_production_runs_each_model_type_as_its_own_application(production):
    apps = applications(production)
    assert apps["serviceai"]["args"]["separate_model_apps"] is True
    assert apps["serviceai"]["route_prefix"] == "/"
    types = [a for a in production["applications"] if a["name"] != "serviceai"]
    for app in types:
        assert app["import_path"] == "app.builder:build_model_type"
        assert app["route_prefix"] is None
        assert app["args"]["name"] == app["name"]
    # The ingress names the types, nothing more: their entries are their applications' args.
    assert apps["serviceai"]["args"]["model_types"] == [a["name"] for a in types]


def test_a_change_to_one_type_restarts_that_type_only(production):
    # Serve gives every deployment of an application the application's code version (import
    # path, runtime_env and args) and restarts them all when it changes.
    def versions(config: dict) -> dict[str, str]:
        return {
            app.name: get_app_code_version(app)
            for app in ServeDeploySchema.model_validate(config).applications
        }

    before = versions(production)
    changed = copy.deepcopy(production)
    applications(changed)["ServiceAi-Pro"]["args"]["model"] = "Qwen/Qwen2.5-72B-Instruct-AWQ"
    after = versions(changed)
    assert {app for app in before if before[app] != after[app]} == {"ServiceAi-Pro"}


def test_production_builds_without_gpus_into_options_ray_accepts(production_deployments):
    names = {(d.app, d.name) for d in production_deployments}
    # Each type's application: a placeholder ingress (Serve refuses a custom request router on
    # an application's ingress under HAProxy) over the model deployment, with its router.
    types = ("ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder", "ServiceAi-Embed")
    assert names == {
        *((name, name) for name in types),
        *((name, "ModelTypeApp") for name in types),
        ("serviceai", "Ingress"),
    }
    for d in production_deployments:
        validate_actor_options(d.replica.ray_actor_options, in_options=True)
        bundles = d.replica.placement_group_bundles
        if bundles:
            validate_placement_group(bundles, d.replica.placement_group_strategy)
        for resource in d.demand():
            if resource.startswith("accelerator_type:"):
                assert resource.removeprefix("accelerator_type:") in ray_accelerator_types()


def test_tensor_parallel_replica_reserves_one_gpu_bundle_per_shard(
    production, production_deployments
):
    pro = next(d for d in production_deployments if d.name == "ServiceAi-Pro")
    bundles = pro.replica.placement_group_bundles
    assert pro.replica.placement_group_strategy == "STRICT_PACK"
    assert [b["GPU"] for b in bundles] == [1.0] * 4
    assert all(b["accelerator_type:H100"] == 0.001 for b in bundles)
    # The replica holds no GPU itself; vLLM's Ray executor puts one worker in each GPU bundle.
    assert pro.replica.resource_dict == {"CPU": bundles[0]["CPU"]}
    config = ModelTypeConfig.model_validate(applications(production)["ServiceAi-Pro"]["args"])
    assert engine_kwargs(config, "m")["distributed_executor_backend"] == "ray"


def serving(deployments: list) -> list:
    """The deployments that serve: not the types' placeholder ingresses, which ask for no
    resource (a GPU node kept for one would defeat scale to zero) and fit on any node."""
    placeholders = [d for d in deployments if d.name == "ModelTypeApp"]
    assert all(not any(d.demand().values()) for d in placeholders)
    return [d for d in deployments if d.name != "ModelTypeApp"]


def test_every_replica_fits_exactly_one_node_type(production_deployments, cluster):
    expected = {
        "ServiceAi-Fast": "gpu_l4",
        "ServiceAi-Pro": "gpu_h100",
        "ServiceAi-Coder": "gpu_l40s",
        "ServiceAi-Embed": "gpu_l4",
        "Ingress": "cpu_ingress",
    }
    for d in serving(production_deployments):
        assert node_type_for(d.demand(), cluster) == [expected[d.name]], d.name


def test_cluster_has_room_for_max_replicas_and_the_rollout_surge(production_deployments, cluster):
    for d in serving(production_deployments):
        (name,) = node_type_for(d.demand(), cluster)
        node_type = cluster["available_node_types"][name]
        per_node = replicas_per_node(d.demand(), node_type["resources"])
        most = d.config.autoscaling_config.max_replicas
        surge = math.ceil(d.config.max_surge_percent * most / 100)
        assert math.ceil((most + surge) / per_node) <= node_type["max_workers"], d.name


def test_rollouts_keep_old_replicas_until_new_ones_serve(production_deployments):
    models = [d for d in production_deployments if d.name != "Ingress"]
    ingress = next(d for d in production_deployments if d.name == "Ingress")
    for d in production_deployments:
        assert d.config.max_surge_percent > 0, d.name
    # Streams pass through the ingress: it drains for as long as the longest model type.
    longest = max(m.config.graceful_shutdown_timeout_s for m in models)
    assert ingress.config.graceful_shutdown_timeout_s >= longest


def test_max_ongoing_requests_leaves_room_to_wait_in_plan_order(production):
    for entry in model_types(production):
        # Beyond the engine's slots, requests wait in the replica in plan order (priority_gate),
        # where a replica started meanwhile cannot take them: half as many again at most.
        assert entry["engine_args"]["scheduling_policy"] == "priority", entry["name"]
        seqs = entry["engine_args"]["max_num_seqs"]
        assert seqs < entry["max_ongoing_requests"] <= 1.5 * seqs, entry["name"]
        scaling = entry["autoscaling_config"]
        assert scaling["target_ongoing_requests"] < entry["max_ongoing_requests"], entry["name"]


def test_engine_args_are_ones_vllm_accepts(production):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    for entry in model_types(production):
        config = ModelTypeConfig.model_validate(entry)
        args = AsyncEngineArgs(**engine_kwargs(config, config.model))  # unknown keys: TypeError
        assert args.enable_prefix_caching is True, entry["name"]
        assert 0 < args.gpu_memory_utilization <= 0.95, entry["name"]
        assert args.quantization in (None, *QUANTIZATION_METHODS), entry["name"]


def test_production_serves_real_models_set_in_the_file_only(production):
    for entry in model_types(production):
        config = ModelTypeConfig.model_validate(entry)
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", config.model), entry["name"]  # a Hugging Face id
        # No SERVICEAI_MODEL_* override: one replica must never serve another model than its peers.
        assert config.model_env is None, entry["name"]


def test_secrets_come_from_the_environment_only(production):
    ingress_env = applications(production)["serviceai"]["args"]["ingress"]["env_vars"]
    secrets = {
        "SERVICEAI_DATABASE_URL",
        "SERVICEAI_REDIS_URL",
        "SERVICEAI_ADMIN_TOKEN",
        "SERVICEAI_SESSION_SECRET",
        "SERVICEAI_SESSION_SECRET_PREVIOUS",
    }
    assert secrets <= ingress_env.keys()
    # Switches may be written here; every other value comes from the node's environment.
    switches = {
        "SERVICEAI_API_DOCS",
        "SERVICEAI_ADMIN_API",
        "SERVICEAI_BODY_READ_TIMEOUT_S",
        "SERVICEAI_SIGN_UP",
    }
    envs = [ingress_env] + [m.get("env_vars", {}) for m in model_types(production)]
    for env in envs:
        for name, value in env.items():
            if name in switches:
                continue
            assert SECRET_REFERENCE.match(value) and value == f"${{{name}}}", name
    assert ingress_env["SERVICEAI_API_DOCS"] == ingress_env["SERVICEAI_ADMIN_API"] == "false"
    assert ingress_env["SERVICEAI_SIGN_UP"] == "approval"
    text = PRODUCTION_SERVE_CONFIG.read_text()
    assert not re.search(r"(postgres(ql)?(\+\w+)?|rediss?)://", text)


def test_scale_to_zero_only_where_the_guide_states_the_cold_start(production):
    cold_start = SIZING_GUIDE.read_text().split("## Cold starts", 1)[1].split("\n## ", 1)[0]
    for entry in model_types(production):
        if entry["autoscaling_config"]["min_replicas"] == 0:
            assert entry["name"] in cold_start, entry["name"]


def test_local_profile_still_builds_one_application():
    built = build_serve_config(LOCAL_SERVE_CONFIG)
    # ServiceAi-Fast's engine runs in the ingress (in_ingress): no deployment of its own.
    assert {(d.app, d.name) for d in built} == {
        ("serviceai", "Ingress"),
        ("serviceai", "ServiceAi-Pro"),
        ("serviceai", "ServiceAi-Coder"),
        ("serviceai", "ServiceAi-Embed"),
    }
    (app,) = load(LOCAL_SERVE_CONFIG)["applications"]
    assert ServeApplicationSchema.model_validate(app).route_prefix == "/"


@pytest.mark.parametrize(
    "path", [LOCAL_SERVE_CONFIG, PRODUCTION_SERVE_CONFIG], ids=lambda p: p.name
)
def test_each_profile_builds_as_serve_runs_it_behind_haproxy(path):
    """Serve refuses some options (a custom request router) on an application's ingress
    deployment only with HAProxy on, as `make run` and production run it: build each profile
    in a process that has it on."""
    code = (
        "from pathlib import Path; from tests.deploy.conftest import build_serve_config; "
        f"build_serve_config(Path({str(path)!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_SERVE_ENABLE_HA_PROXY": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]


GPU_BENCH_CONFIGS = sorted((PROJECT_ROOT / "bench" / "gpu").glob("serve_gpu*.yaml"))


@pytest.mark.parametrize("path", GPU_BENCH_CONFIGS, ids=lambda p: p.name)
def test_the_gpu_benchmarks_configs_build(path):
    """bench/gpu/'s configs run only on a lent GPU machine, whose time is short: a config
    field renamed or refused here must not be found there."""
    built = {(d.app, d.name): d for d in build_serve_config(path)}
    for d in built.values():
        validate_actor_options(d.replica.ray_actor_options, in_options=True)
    if path.name == "serve_gpu_processes.yaml":  # issue 56: Pro as a gang of four
        pro = built[("serviceai", "ServiceAi-Pro")]
        assert pro.config.gang_scheduling_config.gang_size == 4
        assert pro.config.num_replicas == 4
        assert pro.replica.ray_actor_options["num_gpus"] == 0.125


def test_there_are_gpu_benchmark_configs():
    assert [p.name for p in GPU_BENCH_CONFIGS] == ["serve_gpu.yaml", "serve_gpu_processes.yaml"]
