"""cluster.yaml: accepted by Ray's cluster launcher, and what each node type really offers."""

from __future__ import annotations

import configparser
import copy
import os
import re
import subprocess
from pathlib import Path

import pytest
from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager
from ray.autoscaler._private.util import prepare_config, validate_config

from app.serving.ray_runtime import SERVE_ENV
from deployments.model_type import ray_accelerator_types
from rehearsal.cluster import GCS_RECONNECT_S

ROOT = Path(__file__).resolve().parents[2]
HEAD_SCRIPT = ROOT / "deploy" / "vm" / "ray-head.sh"
HEAD_UNIT = ROOT / "deploy" / "vm" / "serviceai-ray-head.service"

# What AWS sells under these names (vCPUs, GPUs, and the device name NVML reports for them),
# from the EC2 instance type pages. Ray derives a node's accelerator_type from the NVML name.
INSTANCE_TYPES = {
    "m7i.2xlarge": {"vcpus": 8, "gpus": 0},
    "g6.xlarge": {"vcpus": 4, "gpus": 1, "nvml_name": "NVIDIA L4"},
    "g6e.xlarge": {"vcpus": 4, "gpus": 1, "nvml_name": "NVIDIA L40S"},
    "p5.48xlarge": {"vcpus": 192, "gpus": 8, "nvml_name": "NVIDIA H100 80GB HBM3"},
}


def node_types(cluster):
    return cluster["available_node_types"]


def worker_types(cluster):
    return {n: t for n, t in node_types(cluster).items() if n != cluster["head_node_type"]}


def gpu_types(cluster):
    return {n: t for n, t in worker_types(cluster).items() if t["resources"].get("GPU")}


def start_line(cluster, key: str) -> str:
    """How a node's Ray starts: the worker's start commands, the head's script (which its
    systemd unit runs)."""
    if key == "head_start_ray_commands":
        return HEAD_SCRIPT.read_text()
    return " ".join(cluster[key])


def test_passes_rays_own_validation_as_ray_up_runs_it(cluster):
    # `ray up` fills in the provider's defaults, then checks the result against Ray's
    # cluster-config JSON schema (ray/autoscaler/ray-schema.json) and its own rules.
    prepared = prepare_config(copy.deepcopy(cluster))
    validate_config(prepared)
    assert prepared["provider"]["type"] == "aws"


def test_node_types_offer_what_their_instances_have(cluster):
    for name, node_type in node_types(cluster).items():
        instance = INSTANCE_TYPES[node_type["node_config"]["InstanceType"]]
        resources = node_type["resources"]
        assert resources["CPU"] <= instance["vcpus"], name
        assert resources.get("GPU", 0) == instance["gpus"], name


def test_gpu_node_types_advertise_the_accelerator_ray_detects_on_them(cluster):
    for name, node_type in gpu_types(cluster).items():
        instance = INSTANCE_TYPES[node_type["node_config"]["InstanceType"]]
        detected = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(instance["nvml_name"])
        accelerators = [r for r in node_type["resources"] if r.startswith("accelerator_type:")]
        assert accelerators == [f"accelerator_type:{detected}"], name
        assert detected in ray_accelerator_types()


def test_one_gpu_node_type_per_gpu_kind(cluster):
    kinds = [
        next(r for r in t["resources"] if r.startswith("accelerator_type:"))
        for t in gpu_types(cluster).values()
    ]
    assert (
        sorted(kinds)
        == sorted(set(kinds))
        == ["accelerator_type:H100", "accelerator_type:L4", "accelerator_type:L40S"]
    )


def test_head_runs_no_replica_and_gpu_nodes_come_and_go(cluster):
    head = node_types(cluster)[cluster["head_node_type"]]
    assert head["resources"] == {"CPU": 0}
    for name, node_type in gpu_types(cluster).items():
        assert node_type["min_workers"] == 0, name
        assert node_type["max_workers"] > 0, name
    assert cluster["idle_timeout_minutes"] > 0
    assert cluster["max_workers"] == sum(t["max_workers"] for t in worker_types(cluster).values())


def test_only_the_cpu_ingress_type_offers_the_ingress_marker(cluster):
    offering = [n for n, t in node_types(cluster).items() if "serviceai_ingress" in t["resources"]]
    assert offering == ["cpu_ingress"]
    assert node_types(cluster)["cpu_ingress"]["min_workers"] >= 1


def test_gpu_nodes_install_the_project_with_the_gpu_extra_and_cpu_nodes_without(cluster):
    install = re.compile(r'uv pip install .*"\$HOME/serviceai(\[gpu\])?"')

    def installs(commands: list[str]) -> list[str]:
        return [m.group(0) for c in commands if (m := install.search(c))]

    def with_gpu_extra(commands: list[str]) -> list[bool]:
        return [c.endswith('[gpu]"') for c in installs(commands)]

    for name, node_type in gpu_types(cluster).items():
        assert with_gpu_extra(node_type["worker_setup_commands"]) == [True], name
    assert with_gpu_extra(cluster["setup_commands"]) == [False]
    assert "worker_setup_commands" not in node_types(cluster)["cpu_ingress"]
    # The autoscaler runs on the head and launches instances through boto3.
    assert any("boto3==" in c for c in cluster["head_setup_commands"])


def test_every_node_runs_python_3_11_from_one_pinned_installer(cluster):
    gpu_setups = [t["worker_setup_commands"] for t in gpu_types(cluster).values()]
    for commands in [cluster["setup_commands"], *gpu_setups]:
        text = "\n".join(commands)
        assert "uv venv --python 3.11 ~/venv" in text
        assert re.search(r"astral\.sh/uv/\d+\.\d+\.\d+/install\.sh", text)


def test_ray_starts_with_token_auth_and_the_environment_file_everywhere(cluster):
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = start_line(cluster, key)
        assert "RAY_AUTH_MODE=token" in start
        assert "set -a && . ~/serviceai.env && set +a" in start
    assert cluster["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert cluster["file_mounts"]["~/serviceai.env"] == "~/.serviceai/production.env"
    assert cluster["file_mounts"]["~/serviceai"] == "~/.serviceai/release"


def test_one_ami_for_cpu_nodes_and_one_for_gpu_nodes(cluster):
    amis = {name: t["node_config"]["ImageId"] for name, t in node_types(cluster).items()}
    gpu = {amis[n] for n in gpu_types(cluster)}
    cpu = {amis[n] for n in amis if n not in gpu_types(cluster)}
    assert len(gpu) == len(cpu) == 1 and gpu != cpu


@pytest.mark.parametrize("node_type", ["gpu_l4", "gpu_l40s", "gpu_h100"])
def test_gpu_disks_hold_the_weights(cluster, node_type):
    # Root volume (GB) against the checkpoint each type downloads: room for the old and the new
    # model during a rollout, and for the venv (torch, vLLM: about 20 GB).
    checkpoint_gb = {"gpu_l4": 3.1, "gpu_l40s": 29.6, "gpu_h100": 145.4}[node_type]
    disk = node_types(cluster)[node_type]["node_config"]["BlockDeviceMappings"][0]["Ebs"]
    assert disk["VolumeSize"] >= 2 * checkpoint_gb + 50


def test_ray_starts_with_the_serve_runtime_the_benchmark_measured(cluster):
    for commands in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = start_line(cluster, commands)
        for name, value in SERVE_ENV.items():
            assert f"{name}={value}" in start, (commands, name)


def test_the_head_keeps_the_gcs_in_redis_and_workers_wait_for_it(cluster):
    """GCS fault tolerance as the rehearsal runs it (rehearsal/cluster.py, gcs_store_env)."""
    head = start_line(cluster, "head_start_ray_commands")
    assert 'RAY_REDIS_ADDRESS="$SERVICEAI_GCS_REDIS_ADDRESS"' in head
    assert "RAY_external_storage_namespace=serviceai" in head
    assert '--redis-password="$SERVICEAI_GCS_REDIS_PASSWORD"' in head
    for commands in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = start_line(cluster, commands)
        assert f"RAY_gcs_rpc_server_reconnect_timeout_s={GCS_RECONNECT_S}" in start, commands


def test_the_heads_ray_runs_under_a_systemd_unit_that_ray_up_installs(cluster):
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str  # systemd's keys are case-sensitive
    unit.read_string(HEAD_UNIT.read_text())
    home = f"/home/{cluster['auth']['ssh_user']}"
    service = unit["Service"]
    assert service["User"] == cluster["auth"]["ssh_user"]
    # The release's copy of the script: cluster.yaml mounts the release at ~/serviceai.
    assert cluster["file_mounts"]["~/serviceai"] == "~/.serviceai/release"
    assert service["ExecStart"] == f"{home}/serviceai/deploy/vm/ray-head.sh"
    assert service["ExecStop"] == f"{home}/venv/bin/ray stop"
    assert (service["Restart"], service["RestartSec"]) == ("always", "5")
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"  # never gives up
    assert unit["Install"]["WantedBy"] == "multi-user.target"  # and starts at boot
    start = " ".join(cluster["head_start_ray_commands"])
    assert "deploy/vm/serviceai-ray-head.service /etc/systemd/system/" in start
    assert "systemctl enable --now serviceai-ray-head" in start
    assert os.access(HEAD_SCRIPT, os.X_OK)


@pytest.mark.parametrize("password", ["", "s3cret"])
def test_the_head_script_starts_ray_in_the_foreground_as_cluster_yaml_says(tmp_path, password):
    """deploy/vm/ray-head.sh run as the unit runs it, with a `ray` that records how it was
    called: in the foreground (the unit restarts it when it exits), with the env file's
    variables, the Serve runtime and the GCS Redis."""
    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    record = tmp_path / "ray-called"
    ray = home / "venv" / "bin" / "ray"
    ray.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {record}.args\nenv > {record}.env\n')
    python = home / "venv" / "bin" / "python"
    python.write_text("#!/bin/bash\necho /opt/haproxy-wrapper/haproxy\n")
    for tool in (ray, python):
        tool.chmod(0o755)
    (home / "serviceai.env").write_text(
        "SERVICEAI_GCS_REDIS_ADDRESS='gcs.internal:6379'\n"
        f"SERVICEAI_GCS_REDIS_PASSWORD='{password}'\n"
        "SERVICEAI_DATABASE_URL='postgresql+asyncpg://u:p@db/serviceai'\n"
    )

    subprocess.run([HEAD_SCRIPT], env={"HOME": str(home), "PATH": os.environ["PATH"]}, check=True)

    args = Path(f"{record}.args").read_text().split("\n")
    env = dict(line.split("=", 1) for line in Path(f"{record}.env").read_text().splitlines())
    assert args[:3] == ["start", "--head", "--block"]
    assert f"--autoscaling-config={home}/ray_bootstrap_config.yaml" in args
    assert ("--redis-password=s3cret" in args) == bool(password)
    assert {k: env[k] for k in SERVE_ENV} == SERVE_ENV
    assert env["RAY_SERVE_HAPROXY_BINARY_PATH"] == "/opt/haproxy-wrapper/haproxy"
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_REDIS_ADDRESS"] == "gcs.internal:6379"
    assert env["SERVICEAI_DATABASE_URL"] == "postgresql+asyncpg://u:p@db/serviceai"
    assert env["RAY_gcs_rpc_server_reconnect_timeout_s"] == str(GCS_RECONNECT_S)
