"""The rehearsal's serve config: production's, with only the override's changes, placeable on
the rehearsal's nodes. Nothing here starts Ray."""

from __future__ import annotations

import copy
import json
import re

import yaml
from ray.serve.schema import ServeDeploySchema

from app.config.settings import Settings
from rehearsal.cluster import worker_node_types
from rehearsal.config import OVERRIDE, PRODUCTION_CONFIG, merged, rehearsal_config
from rehearsal.service import node_env
from tests.deploy.conftest import build_serve_config


def test_merge_takes_engine_args_whole_and_merges_the_rest():
    base = {
        "a": {"x": 1, "y": 2},
        "engine_args": {"gpu_memory_utilization": 0.9, "max_model_len": 8192},
    }
    changes = {"a": {"y": 3}, "engine_args": {"max_model_len": 2048}}
    assert merged(base, changes) == {"a": {"x": 1, "y": 3}, "engine_args": {"max_model_len": 2048}}
    assert base["a"] == {"x": 1, "y": 2}  # the input is left alone


def test_only_what_the_override_names_differs_from_production():
    production = yaml.safe_load(PRODUCTION_CONFIG.read_text())
    rehearsal = rehearsal_config(http_port=18000)
    ServeDeploySchema.model_validate(rehearsal)
    assert rehearsal["proxy_location"] == production["proxy_location"] == "EveryNode"
    assert rehearsal["http_options"] == {
        **production["http_options"],
        "host": "127.0.0.1",
        "port": 18000,
    }
    strip = ("args",)
    assert [{k: v for k, v in a.items() if k not in strip} for a in rehearsal["applications"]] == [
        {k: v for k, v in a.items() if k not in strip} for a in production["applications"]
    ]
    override = yaml.safe_load(OVERRIDE.read_text())
    changed = set(override["every_model_type"]) | {
        k for t in override["model_types"].values() for k in t
    }
    types = len(production["applications"]) - 1  # the ingress's application comes last
    for before, after in zip(production["applications"][:types], rehearsal["applications"]):
        untouched = set(before["args"]) - changed
        assert {k: after["args"][k] for k in untouched} == {k: before["args"][k] for k in untouched}
        embedding = before["args"].get("task") == "embed"
        assert after["args"]["model"] == ("tiny-embed" if embedding else "tiny")
        assert after["args"]["accelerator_type"] == before["args"]["accelerator_type"]
        policy = "scheduling_policy"
        assert after["args"]["engine_args"][policy] == before["args"]["engine_args"][policy]
    # The ingress names the types, as production does; their entries are their own apps' args.
    ingress = rehearsal["applications"][types]["args"]
    assert ingress["model_types"] == [a["name"] for a in rehearsal["applications"][:types]]
    assert ingress["model_types"] == production["applications"][types]["args"]["model_types"]
    assert (
        ingress["ingress"]["resources"]
        == production["applications"][types]["args"]["ingress"]["resources"]
    )


def test_a_change_for_one_type_leaves_the_others_alone():
    before = rehearsal_config(http_port=1)
    after = rehearsal_config(
        http_port=1, model_types={"ServiceAi-Coder": {"engine_args": {"max_model_len": 256}}}
    )
    assert after["applications"][2]["args"]["engine_args"] == {"max_model_len": 256}
    assert after["applications"][:2] == before["applications"][:2]
    # The ingress's args too: Serve would otherwise replace its replicas and their streams.
    assert after["applications"][3:] == before["applications"][3:]


def test_every_deployment_fits_a_rehearsal_node_with_room_for_a_surge(tmp_path):
    path = tmp_path / "rehearsal.yaml"
    path.write_text(yaml.safe_dump(rehearsal_config(http_port=1)))
    nodes = worker_node_types()
    for built in build_serve_config(path):
        demand = copy.deepcopy(built.demand())
        demand.pop("CPU", None)
        if built.name == "ModelTypeApp":  # a type application's placeholder: any node will do
            assert not any(demand.values())
            continue
        hosts = [
            n
            for n in nodes.values()
            if all(
                {**n.resources, "GPU": n.num_gpus}.get(r, 0) >= 2 * amount
                for r, amount in demand.items()
            )
        ]
        assert len(hosts) == 1, (built.name, demand, hosts)


def test_every_variable_the_production_config_reads_is_set_on_the_nodes(tmp_path):
    """An unset ${VAR} expands to nothing, and the ingress refuses to start without, e.g., the
    session secret that several replicas share."""
    lines = [
        line
        for line in PRODUCTION_CONFIG.read_text().splitlines()
        if not line.lstrip().startswith("#")
    ]
    wanted = set(re.findall(r"\$\{(\w+)\}", "\n".join(lines)))
    env = node_env(tmp_path, http_port=8000)
    assert wanted <= set(env)
    # Empty only where empty means "none": no hub token, no Redis (counters in memory), no
    # secret being rotated.
    empty_means_none = {"HF_TOKEN", "SERVICEAI_REDIS_URL", "SERVICEAI_SESSION_SECRET_PREVIOUS"}
    assert {name for name in wanted if not env[name]} <= empty_means_none
    # The ingress's settings accept what the nodes give it.
    settings = {
        k.removeprefix("SERVICEAI_").lower(): v
        for k, v in env.items()
        if k.startswith("SERVICEAI_") and v
    }
    assert (
        Settings.model_validate(
            {**settings, "trusted_proxies": json.loads(settings["trusted_proxies"])}
        ).session_secret
        is not None
    )
