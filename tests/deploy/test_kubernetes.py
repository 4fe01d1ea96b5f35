"""deploy/kubernetes: the Helm chart, rendered by the real `helm` (pinned, from PyPI) with its
default values, the shipped example and two more, gives objects that KubeRay's CRD schema
(v1.7.0, vendored) and Kubernetes' own schemas (kubernetes-validate) accept; its serve config is
the production profile with the values applied, read back here type by type as the replicas
will run it (models, parsers, vLLM's engine arguments); every type's replica fits its pods; the
image is the Ray that pyproject.toml pins, with the Serve settings the VMs get; the Secret holds
the env file's values as the shell reads them."""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from app.serving.ray_runtime import SERVE_ENV
from deployments.deployment_options import engine_kwargs, serve_options
from deployments.model_type import ModelTypeConfig

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
CHART = KUBERNETES / "serviceai"
CRD = KUBERNETES / "crd" / "ray.io_rayservices-v1.7.0.yaml.gz"
VALUES = sorted((KUBERNETES / "values").glob("*.yaml"))
KUBERNETES_VERSION = "1.33.0"  # the oldest minor that managed clusters still offer in 2026
HELM = shutil.which("helm", path=str(Path(sys.executable).parent)) or "helm"


def render(*values: Path, sets: tuple[str, ...] = ()) -> list[dict]:
    """The chart's objects as `helm template` writes them (a failed render raises, with Helm's
    message)."""
    command = [HELM, "template", "serviceai", str(CHART), "--namespace", "serviceai"]
    for path in values:
        command += ["-f", str(path)]
    for assignment in sets:
        command += ["--set", assignment]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RenderFailed(done.stderr)
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


class RenderFailed(Exception):
    pass


@pytest.fixture(scope="module")
def schema() -> dict:
    """The RayService's OpenAPI v3 schema, as KubeRay 1.7.0's CRD declares it (what the API
    server validates a RayService against)."""
    crd = yaml.safe_load(gzip.decompress(CRD.read_bytes()))
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    """Each shipped values file's objects, and the defaults' (key "defaults")."""
    return {"defaults": render(), **{path.stem: render(path) for path in VALUES}}


def the_service(objects: list[dict]) -> dict:
    [service] = [o for o in objects if o["kind"] == "RayService"]
    return service


def serve_config(objects: list[dict]) -> dict:
    return yaml.safe_load(the_service(objects)["spec"]["serveConfigV2"])


def running_types(objects: list[dict]) -> dict[str, ModelTypeConfig]:
    """Each model type as its engine will run it (parsers from the family where asked)."""
    return {
        app["name"]: ModelTypeConfig.model_validate(app["args"]).as_run({})
        for app in serve_config(objects)["applications"]
        if app["import_path"] == "app.builder:build_model_type"
    }


def groups(service: dict) -> list[dict]:
    cluster = service["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]


def containers(service: dict) -> list[dict]:
    return [c for g in groups(service) for c in g["template"]["spec"]["containers"]]


def ray_resources(group: dict) -> dict[str, float]:
    """What the group's Ray node offers the scheduler: CPUs, GPUs and custom resources."""
    params = group["rayStartParams"]
    offered = {"CPU": float(params["num-cpus"]), "GPU": float(params.get("num-gpus", 0))}
    if "resources" in params:
        offered |= json.loads(json.loads(params["resources"]))  # a quoted JSON string
    return offered


def test_left_as_they_are_the_values_serve_the_production_profile(rendered):
    production = yaml.safe_load((ROOT / "serve_config.production.yaml").read_text())
    assert serve_config(rendered["defaults"]) == production
    assert (CHART / "files" / "serve_config.production.yaml").resolve() == (
        ROOT / "serve_config.production.yaml"
    )  # one source: the chart links the profile, it keeps no copy


def test_every_object_is_valid_for_kuberay_and_kubernetes(rendered, schema):
    for name, objects in rendered.items():
        kinds = sorted(o["kind"] for o in objects)
        assert kinds in (["RayService"], ["PersistentVolumeClaim", "RayService"]), name
        for thing in objects:
            if thing["kind"] == "RayService":
                jsonschema.validate(thing, schema)
                # Each pod template, as Kubernetes itself checks a pod's spec.
                for group in groups(thing):
                    template = {"apiVersion": "v1", "kind": "PodTemplate"}
                    template |= {"metadata": {"name": "t"}, "template": group["template"]}
                    kubernetes_validate.validate(template, KUBERNETES_VERSION, strict=True)
            else:
                kubernetes_validate.validate(thing, KUBERNETES_VERSION, strict=True)


def test_the_schemas_catch_a_mistake(rendered, schema):
    """The vendored schemas are live: a wrong type or an unknown field is refused."""
    service = json.loads(json.dumps(the_service(rendered["defaults"])))
    service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(service, schema)
    template = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    template["spec"]["containers"][0]["envFrm"] = []
    pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod | {"template": template}, KUBERNETES_VERSION, strict=True)


def test_each_types_effective_model_and_parsers_read_back_from_the_serve_config(rendered):
    def effective(name: str) -> dict[str, tuple]:
        return {
            t.name: (t.model, t.tool_call_parser, t.reasoning_parser)
            for t in running_types(rendered[name]).values()
        }

    production = {
        "ServiceAi-Fast": ("Qwen/Qwen2.5-1.5B-Instruct", "hermes", None),
        "ServiceAi-Pro": ("Qwen/Qwen2.5-72B-Instruct", "hermes", None),
        "ServiceAi-Coder": ("Qwen/Qwen2.5-Coder-14B-Instruct", "hermes", None),
        "ServiceAi-Embed": ("Qwen/Qwen3-Embedding-0.6B", None, None),
    }
    assert effective("defaults") == production
    assert effective("example") == production | {
        "ServiceAi-Coder": ("Qwen/Qwen2.5-Coder-7B-Instruct", "hermes", None)
    }
    assert effective("l40s-only") == production | {
        "ServiceAi-Pro": ("Qwen/Qwen3-32B", "hermes", "qwen3")  # the family's
    }
    assert effective("h100-llama") == production | {
        "ServiceAi-Pro": ("meta-llama/Llama-3.3-70B-Instruct", "llama3_json", None),
        "ServiceAi-Coder": ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder", None),  # chosen
    }
    pro = running_types(rendered["l40s-only"])["ServiceAi-Pro"]
    assert pro.engine_args["reasoning_config"]["reasoning_start_str"] == "<think>"
    for objects in rendered.values():  # one model on every replica of a type
        assert all(t.model_env is None for t in running_types(objects).values())


def test_each_types_engine_arguments_are_ones_vllm_accepts(rendered):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    for name, objects in rendered.items():
        for model in running_types(objects).values():
            args = AsyncEngineArgs(**engine_kwargs(model, model.model))  # unknown keys: TypeError
            assert args.quantization in (None, *QUANTIZATION_METHODS), (name, model.name)
            assert 0 < args.gpu_memory_utilization <= 0.95, (name, model.name)
    coder = running_types(rendered["h100-llama"])["ServiceAi-Coder"]
    assert coder.engine_args["quantization"] is None and coder.engine_args["max_model_len"] == 65536
    pro = running_types(rendered["l40s-only"])["ServiceAi-Pro"]
    assert (pro.tensor_parallel_size, pro.accelerator_type) == (2, "L40S")


def test_every_types_replica_fits_its_own_group_with_room_to_scale(rendered):
    for name, objects in rendered.items():
        service = the_service(objects)
        workers = {
            g["groupName"]: g for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        }
        for model in running_types(objects).values():
            group = workers[f"gpu-{model.name.lower().removeprefix('serviceai-')}"]
            bundles = serve_options(model).get("placement_group_bundles") or [
                {
                    "CPU": model.num_cpus,
                    "GPU": model.num_gpus_per_shard,
                    f"accelerator_type:{model.accelerator_type}": 0.001,
                }
            ]
            needed: dict[str, float] = {}
            for bundle in bundles:
                for resource, amount in bundle.items():
                    needed[resource] = needed.get(resource, 0) + amount
            offered = ray_resources(group)
            assert all(offered.get(r, 0) >= v for r, v in needed.items()), (name, model.name)
            scaling = model.autoscaling_config or {}
            assert group["maxReplicas"] >= scaling.get("max_replicas", 1), (name, model.name)
            assert group["minReplicas"] == scaling.get("min_replicas", 1), (name, model.name)
            pod = group["template"]["spec"]
            # The pod asks Kubernetes for what its Ray node offers, on the GPU it was given.
            limits = pod["containers"][0]["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) == offered["GPU"], (name, model.name)
            assert float(limits["cpu"]) >= offered["CPU"], (name, model.name)
            assert pod["nodeSelector"]["nvidia.com/gpu.product"].startswith("NVIDIA-")
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
                pod["tolerations"]
            )
            shm = [v for v in pod.get("volumes", []) if v["name"] == "shm"]
            assert bool(shm) == (model.tensor_parallel_size > 1), (name, model.name)


def test_the_ingress_has_pods_of_its_own_and_the_head_runs_no_replica(rendered):
    for objects in rendered.values():
        head, *workers = groups(the_service(objects))
        assert head["rayStartParams"]["num-cpus"] == "0"
        ingress = [g for g in workers if "serviceai_ingress" in ray_resources(g)]
        assert len(ingress) == 1 and ray_resources(ingress[0])["GPU"] == 0
        [edge] = [a for a in serve_config(objects)["applications"] if a["name"] == "serviceai"]
        assert (
            ingress[0]["maxReplicas"] * ray_resources(ingress[0])["CPU"]
            >= edge["args"]["ingress"]["num_cpus"] * 2
        )  # its min_replicas fit


def test_secrets_by_name_token_auth_and_the_head_surviving_its_restart(rendered):
    service = the_service(rendered["defaults"])
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token"}
    options = cluster["gcsFaultToleranceOptions"]
    assert options["redisPassword"]["valueFrom"]["secretKeyRef"] == {
        "name": "serviceai-gcs-redis",
        "key": "password",
    }
    for container in containers(service):
        assert container["envFrom"] == [{"secretRef": {"name": "serviceai-env"}}]
        assert container["image"] == "serviceai:0.1.0"  # the chart's appVersion
    renamed = the_service(rendered["h100-llama"])
    assert renamed["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]["redisAddress"] == (
        "10.0.12.7:6379"
    )
    for group in groups(renamed):  # a rotation's new revision rolls every pod
        annotations = group["template"]["metadata"]["annotations"]
        assert annotations == {"serviceai/secrets-revision": "2026-12-01"}
    assert "annotations" not in groups(service)[0]["template"]["metadata"]
    for container in containers(renamed):
        assert container["envFrom"] == [{"secretRef": {"name": "serviceai-prod-env"}}]
        assert container["image"] == "ghcr.io/acme/serviceai:0.1.0-acme.2"
        assert {"name": "VLLM_LOGGING_LEVEL", "value": "WARNING"} in container["env"]


def test_the_model_cache_and_the_upgrade_strategy(rendered):
    assert the_service(rendered["defaults"])["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    example = rendered["example"]
    [claim] = [o for o in example if o["kind"] == "PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    service = the_service(example)
    assert service["spec"]["upgradeStrategy"]["type"] == "NewClusterWithIncrementalUpgrade"
    for group in service["spec"]["rayClusterConfig"]["workerGroupSpecs"][1:]:  # the GPU pods
        pod = group["template"]["spec"]
        [volume] = [v for v in pod["volumes"] if v["name"] == "model-cache"]
        assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
        [container] = pod["containers"]
        assert {"name": "HF_HOME", "value": "/models-cache"} in container["env"]
        assert {"name": "model-cache", "mountPath": "/models-cache"} in container["volumeMounts"]
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert "volumes" not in head  # only the pods that load a model


@pytest.mark.parametrize("values", VALUES, ids=lambda path: path.stem)
def test_helm_lint_finds_nothing_in_the_chart(values):
    done = subprocess.run(
        [HELM, "lint", "--strict", str(CHART), "-f", str(values)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_values_mistake_stops_the_render_naming_it():
    with pytest.raises(RenderFailed, match="ServiceAi-Turbo: the production profile has no such"):
        render(sets=("types.ServiceAi-Turbo.model=acme/x",))
    with pytest.raises(RenderFailed, match="gpusPerReplca"):  # the values schema
        render(sets=("types.ServiceAi-Pro.gpusPerReplca=2",))
    with pytest.raises(RenderFailed, match="clusterUpgradeOptions"):
        render(sets=("upgradeStrategy.type=NewClusterWithIncrementalUpgrade",))
    with pytest.raises(RenderFailed, match="no product label known for accelerator T4"):
        render(sets=("types.ServiceAi-Fast.accelerator=T4",))


def test_the_image_is_the_pinned_ray_with_the_serve_settings_the_vms_get(rendered):
    dockerfile = (KUBERNETES / "Dockerfile").read_text()
    ray_pin = re.search(r'"ray\[serve\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text())[1]
    assert re.search(rf"^FROM rayproject/ray:{re.escape(ray_pin)}-py311-cu\d+$", dockerfile, re.M)
    service = the_service(rendered["defaults"])
    assert service["spec"]["rayClusterConfig"]["rayVersion"] == ray_pin
    env = dict(re.findall(r"^\s*(?:ENV )?([A-Za-z_]+)=(\S*?)(?: \\)?$", dockerfile, re.M))
    assert {k: env[k] for k in SERVE_ENV} == SERVE_ENV


def test_the_secret_holds_each_value_of_the_env_file_as_the_shell_reads_it(tmp_path):
    """kubectl's --from-env-file keeps quotes; the VMs' file quotes the database URL and the
    proxies' JSON. The script's Secret holds what `source` gives the VMs."""
    env_file = tmp_path / "production.env"
    env_file.write_text(
        "SERVICEAI_DATABASE_URL='postgresql+asyncpg://serviceai:p%40ss@db:5432/serviceai'\n"
        'SERVICEAI_TRUSTED_PROXIES=\'["172.31.0.0/16", "127.0.0.1/32"]\'\n'
        "SERVICEAI_GCS_REDIS_PASSWORD=''\n"
        "HF_TOKEN=hf_plain\n"
    )
    made = subprocess.run(
        [KUBERNETES / "env-secret.sh", env_file, "serviceai-env", "--dry-run=client", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(made.stdout).get("data", {})
    held = {name: base64.b64decode(value).decode() for name, value in data.items()}
    assert held == {
        "SERVICEAI_DATABASE_URL": "postgresql+asyncpg://serviceai:p%40ss@db:5432/serviceai",
        "SERVICEAI_TRUSTED_PROXIES": '["172.31.0.0/16", "127.0.0.1/32"]',
        "SERVICEAI_GCS_REDIS_PASSWORD": "",
        "HF_TOKEN": "hf_plain",
    }
