"""deploy/kubernetes: the RayService is valid against KubeRay's own CRD schema (v1.7.0, vendored),
carries the production profile verbatim, and gives every model type the pods its replicas
need; each overlay, applied as kustomize applies its JSON patches, stays valid; the image is
the Ray that pyproject.toml pins, with the Serve settings the VMs get."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import jsonpatch
import jsonschema
import pytest
import yaml

from app.serving.ray_runtime import SERVE_ENV
from deployments.catalog import LOGICAL_MODEL_TYPES
from deployments.model_type import ModelTypeConfig

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
CRD = KUBERNETES / "crd" / "ray.io_rayservices-v1.7.0.yaml.gz"
OVERLAYS = sorted(p for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def schema() -> dict:
    """The RayService's OpenAPI v3 schema, as KubeRay 1.7.0's CRD declares it (what the API
    server validates a RayService against)."""
    crd = yaml.safe_load(gzip.decompress(CRD.read_bytes()))
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def base() -> dict:
    return yaml.safe_load((KUBERNETES / "base" / "rayservice.yaml").read_text())


def overlaid(overlay: Path) -> dict:
    """The base with the overlay's images and JSON patches applied, as `kubectl apply -k` does."""
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../../base"]
    service = base()
    for patch in kustomization.get("patches", []):
        assert patch["target"]["kind"] == "RayService"
        operations = yaml.safe_load((overlay / patch["path"]).read_text())
        service = jsonpatch.apply_patch(service, operations)
    images = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in kustomization.get("images", [])}
    for container in containers(service):
        container["image"] = images.get(container["image"], container["image"])
    return service


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


def test_the_rayservice_and_every_overlay_are_valid_rayservices(schema):
    for service in [base(), *map(overlaid, OVERLAYS)]:
        jsonschema.validate(service, schema)
        assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"


def test_it_serves_the_production_profile_verbatim():
    embedded = base()["spec"]["serveConfigV2"]
    assert embedded == (ROOT / "serve_config.production.yaml").read_text(), (
        "run python deploy/kubernetes/embed.py"
    )


def test_every_model_type_has_a_gpu_group_that_holds_its_replica_and_room_to_scale():
    config = yaml.safe_load(base()["spec"]["serveConfigV2"])
    worker_groups = base()["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    for app in config["applications"]:
        if "model_type" not in app["args"]:
            continue
        model = ModelTypeConfig.model_validate(app["args"]["model_type"])
        bundles = model.serve_options().get("placement_group_bundles") or [
            {
                "CPU": model.num_cpus,
                "GPU": model.num_gpus_per_shard,
                f"accelerator_type:{model.accelerator_type}": 0.001,
            }
        ]
        needed: dict[str, float] = {}
        for bundle in bundles:
            for name, amount in bundle.items():
                needed[name] = needed.get(name, 0) + amount
        fits = [
            g
            for g in worker_groups
            if all(ray_resources(g).get(n, 0) >= v for n, v in needed.items())
        ]
        assert fits, f"no worker group holds a replica of {model.name}: {needed}"
        scaling = model.autoscaling_config or {}
        assert sum(g["maxReplicas"] for g in fits) >= scaling.get("max_replicas", 1), model.name
        for group in fits:
            # The pod asks Kubernetes for what its Ray node offers.
            limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
            assert int(limits.get("nvidia.com/gpu", 0)) == ray_resources(group)["GPU"]
            assert float(limits["cpu"]) >= ray_resources(group)["CPU"]


def test_the_ingress_has_pods_of_its_own_and_the_head_runs_no_replica():
    service = base()
    head, *workers = groups(service)
    assert head["rayStartParams"]["num-cpus"] == "0"
    ingress = [g for g in workers if "serviceai_ingress" in ray_resources(g)]
    assert len(ingress) == 1 and ray_resources(ingress[0])["GPU"] == 0
    production = yaml.safe_load(service["spec"]["serveConfigV2"])
    [edge] = [a for a in production["applications"] if a["name"] == "serviceai"]
    assert (
        ingress[0]["maxReplicas"] * ray_resources(ingress[0])["CPU"]
        >= edge["args"]["ingress"]["num_cpus"] * 2
    )  # its min_replicas fit


def test_the_head_survives_with_gcs_fault_tolerance_and_every_pod_has_the_secrets():
    service = base()
    options = service["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert options["redisAddress"] and options["redisPassword"]["valueFrom"]["secretKeyRef"]
    for container in containers(service):
        assert {"secretRef": {"name": "serviceai-env"}} in container["envFrom"]
        assert container["image"] == "serviceai"  # each overlay names the image it built


def test_an_overlay_sets_each_model_through_the_catalogs_variable():
    names = {t.model_env for t in LOGICAL_MODEL_TYPES.values()}
    for overlay in OVERLAYS:
        service = overlaid(overlay)
        set_here = {e["name"] for c in containers(service) for e in c.get("env", [])}
        assert set_here and set_here <= names, set_here
        assert all(":" in c["image"] for c in containers(service))


def test_the_image_is_the_pinned_ray_with_the_serve_settings_the_vms_get():
    dockerfile = (KUBERNETES / "Dockerfile").read_text()
    ray_pin = re.search(r'"ray\[serve\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text())[1]
    assert re.search(rf"^FROM rayproject/ray:{re.escape(ray_pin)}-py311-cu\d+$", dockerfile, re.M)
    assert base()["spec"]["rayClusterConfig"]["rayVersion"] == ray_pin
    env = dict(re.findall(r"^\s*(?:ENV )?([A-Za-z_]+)=(\S*?)(?: \\)?$", dockerfile, re.M))
    assert {k: env[k] for k in SERVE_ENV} == SERVE_ENV


def test_the_schema_catches_a_mistake(schema):
    """The vendored schema is live: a wrong type or a required field left out is refused."""
    service = base()
    service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(service, schema)
    service = base()
    del service["spec"]["rayClusterConfig"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(service, schema)


def test_the_secret_holds_each_value_of_the_env_file_as_the_shell_reads_it(tmp_path):
    """kubectl's --from-env-file keeps quotes; the VMs' file quotes the database URL and the
    proxies' JSON. The script's Secret holds what `source` gives the VMs."""
    import base64
    import subprocess

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
