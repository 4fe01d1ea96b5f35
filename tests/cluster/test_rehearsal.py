"""The production path on a multi-node Ray cluster: `ray start` nodes, `serve deploy`, failures.

The tests run in file order on one cluster (the `rehearsal` fixture): a type whose node joins
late, placement, a cold start from zero, a rolling update under load, autoscaling, a lost
worker node, a lost head (GCS fault tolerance), and last one type's replicas on two nodes with
prefix affinity. Figures (seconds, stream counts) go to `rehearsal.figures`, printed at the end.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from collections.abc import Callable
from statistics import median
from typing import Any

import httpx
import psutil
import pytest

from rehearsal.cluster import NODE_LABEL, worker_node_types
from rehearsal.config import rehearsal_config
from rehearsal.service import add_node
from tests.cluster.conftest import LATE_NODE, Rehearsal, wait_for
from tests.cluster.streams import Load, stream_chat
from tests.conftest import error_of

pytestmark = pytest.mark.cluster

MODEL_TYPES = ("ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder")
SPARE_L4S = ("gpu_l4_b", "gpu_l4_c")


def type_args(name: str) -> dict[str, Any]:
    """A model type's args as `serve deploy` sent them (production + the override)."""
    config = rehearsal_config(http_port=0)
    return next(a["args"] for a in config["applications"] if a["name"] == name)


async def wait_for_async(probe: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """wait_for in a thread: the event loop keeps the streams of a Load flowing meanwhile."""
    return await asyncio.to_thread(wait_for, probe, timeout_s, 1.0, what)


def running(rehearsal: Rehearsal, deployment: str) -> int:
    app = rehearsal.status()["applications"].get(deployment, {})
    states = app.get("deployments", {}).get(deployment, {}).get("replica_states", {})
    return states.get("RUNNING", 0)


def test_a_type_deployed_before_its_node_joins_is_pending_then_serves(rehearsal):
    # No node offers accelerator_type:H100 yet: Pro's replica cannot be placed.
    status, body = rehearsal.ready()
    assert status == 503, body
    assert body["model_types"] == {
        "ServiceAi-Fast": "ready",
        "ServiceAi-Pro": "pending",
        "ServiceAi-Coder": "ready",
        "ServiceAi-Embed": "ready",  # scales to zero: a request starts its replica
    }
    assert rehearsal.app_status("ServiceAi-Pro") == "DEPLOYING"
    refused = rehearsal.chat("ServiceAi-Pro")
    assert error_of(refused, 503)["code"] == "model_unavailable"
    assert int(refused.headers["retry-after"]) > 0

    joined = time.monotonic()
    add_node(rehearsal.cluster, LATE_NODE)
    wait_for(
        lambda: rehearsal.serves("ServiceAi-Pro"),
        timeout_s=300,
        interval_s=2,
        what="ServiceAi-Pro to serve once its node joined",
    )
    rehearsal.figures["pro_serves_after_its_node_joined_s"] = round(time.monotonic() - joined, 1)
    wait_for(lambda: rehearsal.ready()[0] == 200, timeout_s=30, what="/ready 200")
    assert rehearsal.app_status("ServiceAi-Pro") == "RUNNING"


def test_replicas_and_proxies_are_where_the_production_config_puts_them(rehearsal):
    by_name = rehearsal.alive_nodes()
    nodes = {n["node_id"]: n for n in by_name.values()}
    assert set(by_name) == {"head", "cpu_ingress", "gpu_l4", "gpu_l40s", "gpu_h100"}

    # proxy_location: EveryNode: a proxy (HAProxy) on the head and on every node that runs a
    # replica, each healthy; clients may connect to any of them.
    replicas = [
        a
        for a in rehearsal.ray_list("actors", "state=ALIVE")
        if a["class_name"].startswith("ServeReplica:")
    ]
    hosts = {by_name["head"]["node_id"]} | {r["node_id"] for r in replicas}
    assert rehearsal.status()["proxies"] == {node_id: "HEALTHY" for node_id in hosts}

    # The ingress only where its marker resource is (cluster.yaml's cpu_ingress nodes).
    for replica in rehearsal.alive_replicas("Ingress"):
        assert nodes[replica["node_id"]]["labels"][NODE_LABEL] == "cpu_ingress"

    # Each single-GPU type on a node with a GPU and the accelerator type it asks for.
    for name in ("ServiceAi-Fast", "ServiceAi-Coder"):
        args = type_args(name)
        for replica in rehearsal.alive_replicas(name):
            resources = nodes[replica["node_id"]]["resources_total"]
            assert resources["GPU"] >= args["num_gpus_per_shard"]
            assert resources[f"accelerator_type:{args['accelerator_type']}"] > 0
            assert replica["required_resources"]["GPU"] == args["num_gpus_per_shard"]

    # The tensor-parallel type: one bundle per shard, all on one H100 node (STRICT_PACK).
    pro = type_args("ServiceAi-Pro")
    [replica] = rehearsal.alive_replicas("ServiceAi-Pro")
    group = rehearsal.placement_group(replica["placement_group_id"])
    assert group["state"] == "CREATED" and group["strategy"] == "STRICT_PACK"
    assert len(group["bundles"]) == pro["tensor_parallel_size"] == 2
    assert all(b["GPU"] == 1 and b["accelerator_type:H100"] > 0 for b in group["bundles"].values())
    assert set(group["bundles_to_node_id"].values()) == {by_name["gpu_h100"]["node_id"]}
    assert replica["node_id"] == by_name["gpu_h100"]["node_id"]
    # Its engine runs both shards (vLLM CPU: as processes of the replica, see deployments/vllm_engine/engine.py).
    shards = [
        " ".join(p.cmdline()).strip()
        for p in psutil.Process(replica["pid"]).children(recursive=True)
    ]
    assert sorted(s for s in shards if s.startswith("VLLM::Worker_TP")) == [
        "VLLM::Worker_TP0",
        "VLLM::Worker_TP1",
    ]


def test_min_replicas_0_type_serves_its_first_request_after_a_cold_start(rehearsal):
    assert type_args("ServiceAi-Coder")["autoscaling_config"]["min_replicas"] == 0
    assert rehearsal.alive_replicas("ServiceAi-Coder") == []
    assert rehearsal.ready()[1]["model_types"]["ServiceAi-Coder"] == "ready"

    started = time.monotonic()
    response = rehearsal.chat("ServiceAi-Coder")
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    rehearsal.figures["coder_cold_start_first_request_s"] = round(time.monotonic() - started, 1)
    assert len(rehearsal.alive_replicas("ServiceAi-Coder")) == 1


def replica_ids(rehearsal: Rehearsal, deployment: str) -> set[str]:
    return {a["actor_id"] for a in rehearsal.alive_replicas(deployment)}


async def test_rolling_update_of_one_type_under_load(rehearsal):
    """`serve deploy` of new engine args for Coder while every type streams."""
    for name in MODEL_TYPES:  # Coder may have scaled to zero
        wait_for(
            lambda name=name: rehearsal.serves(name),
            timeout_s=300,
            interval_s=2,
            what=f"{name} serving",
        )
    before = {name: replica_ids(rehearsal, name) for name in (*MODEL_TYPES, "Ingress")}
    coder = type_args("ServiceAi-Coder")
    new_max_model_len = 256
    # A prompt the old engine (2048 tokens) takes and the new one (256) refuses: it tells
    # which replica answered.
    probe = {"messages": [{"role": "user", "content": "hello world " * 150}], "max_tokens": 1}

    # One stream at a time per type: two cores must also start the new engine meanwhile. Pro's
    # two shards sync every step and crawl when other engines hold the cores: short replies.
    clients = {name: 1 for name in MODEL_TYPES}
    async with Load(rehearsal.origin, rehearsal.api_key, clients, {"ServiceAi-Pro": 8}) as load:
        await wait_for_async(
            lambda: all(load.tally(m)["completed"] for m in MODEL_TYPES),
            timeout_s=180,
            what="streams to every type",
        )
        assert (
            await asyncio.to_thread(rehearsal.chat, "ServiceAi-Coder", **probe)
        ).status_code == 200
        deployed = time.monotonic()
        await asyncio.to_thread(
            rehearsal.deploy,
            model_types={
                "ServiceAi-Coder": {
                    "engine_args": {**coder["engine_args"], "max_model_len": new_max_model_len}
                }
            },
        )

        def new_engine_answers() -> bool:
            response = rehearsal.chat("ServiceAi-Coder", **probe)
            assert response.status_code in (200, 400, 503), response.text
            if response.status_code == 503:
                assert int(response.headers["retry-after"]) > 0
            return (
                response.status_code == 400
                and response.json()["error"]["code"] == "context_length_exceeded"
            )

        # Serve starts the new replica before it stops the old one; its engine starts on two
        # cores that every type's engines keep busy: 146.6 s and 182.2 s in two runs, 629.6 s
        # in a CI run of 2026-11-24 (the controller's "started successfully ... after").
        await wait_for_async(new_engine_answers, timeout_s=900, what="the new Coder engine")
        rehearsal.figures["rolling_update_new_replica_served_s"] = round(
            time.monotonic() - deployed, 1
        )
        await wait_for_async(
            lambda: (
                rehearsal.app_status("ServiceAi-Coder") == "RUNNING"
                and not replica_ids(rehearsal, "ServiceAi-Coder") & before["ServiceAi-Coder"]
            ),
            timeout_s=120,
            what="the old Coder replica gone",
        )
        served_before = load.tally("ServiceAi-Coder")["completed"]
        await wait_for_async(
            lambda: load.tally("ServiceAi-Coder")["completed"] >= served_before + 2,
            timeout_s=60,
            what="streams on the new Coder replica",
        )

    rehearsal.figures["rolling_update_ingress_replaced"] = (
        not replica_ids(rehearsal, "Ingress") & before["Ingress"]
    )
    rehearsal.figures["rolling_update_streams"] = {m: dict(load.tally(m)) for m in MODEL_TYPES}
    rehearsal.figures["rolling_update_statuses"] = {m: dict(load.statuses(m)) for m in MODEL_TYPES}
    # The ingress's args name the types only: a change to one type leaves its replicas alone.
    assert replica_ids(rehearsal, "Ingress") == before["Ingress"], "the ingress was replaced"
    for name in ("ServiceAi-Fast", "ServiceAi-Pro"):
        assert set(load.tally(name)) == {"completed"}, load.tally(name)
        assert replica_ids(rehearsal, name) == before[name], f"{name} was restarted"
    # The changed type: streams finish, or end with an error event and [DONE]; a refusal is
    # a 503 with Retry-After; never a hang, a truncated stream or another 5xx.
    assert load.tally("ServiceAi-Coder")["broken"] == 0, [
        o for o in load.outcomes if o.kind == "broken"
    ]


def steady(rehearsal: Rehearsal, deployment: str, replicas: int) -> bool:
    """Exactly `replicas` running, none starting or stopping: a stopping replica holds its
    share of the node's GPU until its actor is gone, and a new one could not be placed."""
    app = rehearsal.status()["applications"].get(deployment, {})
    states = app.get("deployments", {}).get(deployment, {}).get("replica_states", {})
    return states == {"RUNNING": replicas} and len(rehearsal.alive_replicas(deployment)) == replicas


async def test_a_type_scales_up_under_concurrent_streams_and_back_down(rehearsal):
    # One flap (2026-11-24, before the rolling update changed Coder alone): the surge replica
    # waited for the GPU share of a replica still in its graceful shutdown; hence `steady`.
    autoscaling = type_args("ServiceAi-Fast")["autoscaling_config"]
    await wait_for_async(
        lambda: steady(rehearsal, "ServiceAi-Fast", autoscaling["min_replicas"]),
        timeout_s=180,
        what="Fast at its minimum, nothing starting or stopping",
    )
    async with Load(
        rehearsal.origin, rehearsal.api_key, {"ServiceAi-Fast": 8}, default_tokens=200, pause_s=0
    ) as load:
        started = time.monotonic()
        # The new replica starts its engine on two cores that eight streams keep busy: 65.6 s
        # in one run, 139.3 s (CI) and 178.8 s in others.
        await wait_for_async(
            lambda: running(rehearsal, "ServiceAi-Fast") == autoscaling["max_replicas"],
            timeout_s=300,
            what="Fast scaled up",
        )
        rehearsal.figures["autoscale_up_s"] = round(time.monotonic() - started, 1)
    stopped = time.monotonic()
    await wait_for_async(
        lambda: running(rehearsal, "ServiceAi-Fast") == autoscaling["min_replicas"],
        timeout_s=180,
        what="Fast scaled down",
    )
    rehearsal.figures["autoscale_down_after_load_s"] = round(time.monotonic() - stopped, 1)
    rehearsal.figures["autoscale_streams"] = dict(load.tally("ServiceAi-Fast"))
    assert set(load.tally("ServiceAi-Fast")) == {"completed"}, load.tally("ServiceAi-Fast")


async def test_a_lost_worker_node_ends_its_streams_and_serves_again_once_back(rehearsal):
    cluster = rehearsal.cluster
    ingress = replica_ids(rehearsal, "Ingress")
    async with httpx.AsyncClient(
        base_url=rehearsal.origin, headers=rehearsal.headers, timeout=httpx.Timeout(120, connect=10)
    ) as client:
        # The engine must still be generating when the node goes. In one CI run (2026-11-24)
        # all of eight 2,000-token streams completed although the kill came right after
        # their first two chunks: the engine had finished before the clients saw them flow.
        # Eight streams of n=8 are 64 sequences, 16 at a time: tens of seconds of engine
        # work. The node goes once the first stream flows; the others are streaming or still
        # wait for the engine (and then get their 503 as a request arriving now would).
        flowing = asyncio.Event()
        streams = [
            asyncio.create_task(
                stream_chat(client, "ServiceAi-Fast", 2000, flowing, ignore_eos=True, n=8)
            )
            for _ in range(8)
        ]
        await asyncio.wait_for(flowing.wait(), timeout=60)
        lost = time.monotonic()
        await asyncio.to_thread(cluster.kill_node, "gpu_l4")
        killed = time.monotonic()  # every process of the node is gone
        outcomes = await asyncio.wait_for(asyncio.gather(*streams), timeout=120)

    # A stream the kill cut short ends with an error event and [DONE], never a hang or a
    # truncated stream; one that had no reply yet is refused like a new request; a stream
    # may complete only with every token.
    timing = {"lost": lost, "killed": killed, "outcomes": outcomes}
    cut = [o for o in outcomes if o.kind == "error_event"]
    assert cut, timing
    for outcome in outcomes:
        assert outcome.kind in ("completed", "error_event", "refused_503"), timing
        if outcome.kind != "completed":
            assert outcome.error_code == "model_unavailable", timing
        if outcome.kind == "error_event":
            assert outcome.done, timing
    rehearsal.figures["lost_node_streams_cut"] = f"{len(cut)} of {len(outcomes)}"
    rehearsal.figures["lost_node_streams_ended_within_s"] = round(
        max(o.ended_at for o in cut) - lost, 1
    )

    # New requests: 503 model_unavailable with Retry-After while no replica is left.
    def refused() -> httpx.Response | None:
        response = rehearsal.chat("ServiceAi-Fast")
        assert response.status_code == 503, response.text
        return response if response.json()["error"]["code"] == "model_unavailable" else None

    response = wait_for(refused, timeout_s=60, what="503 model_unavailable")
    rehearsal.figures["lost_node_new_request_refused_503_within_s"] = round(
        time.monotonic() - killed, 1
    )
    assert int(response.headers["retry-after"]) > 0
    assert rehearsal.ready()[1]["model_types"]["ServiceAi-Fast"] == "unavailable"
    assert rehearsal.serves("ServiceAi-Coder") and rehearsal.serves("ServiceAi-Pro")

    back = time.monotonic()
    add_node(cluster, "gpu_l4")
    wait_for(
        lambda: rehearsal.serves("ServiceAi-Fast"),
        timeout_s=300,
        interval_s=2,
        what="Fast to serve once a worker is back",
    )
    rehearsal.figures["lost_node_serves_again_after_node_back_s"] = round(
        time.monotonic() - back, 1
    )
    # Neither the head nor the ingress was touched.
    assert replica_ids(rehearsal, "Ingress") == ingress
    assert "head" in cluster.nodes and rehearsal.ready()[0] == 200


async def test_the_head_is_lost_the_worker_nodes_serve_and_it_comes_back(rehearsal):
    """GCS fault tolerance (the GCS in the test Redis, as production's in a Redis of its own):
    every process of the head (GCS, dashboard, Serve controller, its HAProxy) is SIGKILLed
    while clients stream through the cpu_ingress node's proxy, where a balancer sends them once
    the head's proxy stops answering. Streams in flight finish, new ones are served, the head
    is started again on the same address (what `ray up --restart-only` does on a VM), reads
    the cluster back, and the control plane acts again: the scale-up the outage's load asked
    for applies."""
    cluster = rehearsal.cluster
    await wait_for_async(
        lambda: steady(rehearsal, "ServiceAi-Fast", 1), timeout_s=180, what="Fast at 1 replica"
    )
    origin = rehearsal.node_origin("cpu_ingress")
    async with httpx.AsyncClient(
        base_url=origin, headers=rehearsal.headers, timeout=httpx.Timeout(120, connect=10)
    ) as client:
        flowing = asyncio.Event()
        in_flight = [
            asyncio.create_task(
                stream_chat(client, "ServiceAi-Fast", 1500, flowing, ignore_eos=True)
            )
            for _ in range(2)
        ]
        await asyncio.wait_for(flowing.wait(), timeout=60)
        lost = time.monotonic()
        await asyncio.to_thread(cluster.kill_node, "head")
        # A balancer's health check fails here: refused, or reset by a listener going down.
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{rehearsal.origin}/health", timeout=5)

        # Six clients streaming one request after another: more than Fast's one replica's
        # target (2 ongoing), so Serve would add one, but no actor can start without the GCS.
        async with Load(
            origin, rehearsal.api_key, {"ServiceAi-Fast": 6}, default_tokens=64
        ) as load:
            await wait_for_async(
                lambda: len(load.outcomes) >= 30, timeout_s=120, what="30 streams in the outage"
            )
            during = load.tally("ServiceAi-Fast")
            outcomes = await asyncio.gather(*in_flight)
            back = time.monotonic()
            await asyncio.to_thread(cluster.start_head)
            restarted = time.monotonic()
            await wait_for_async(
                lambda: running_or_none(rehearsal, "ServiceAi-Fast") is not None,
                timeout_s=120,
                what="serve status to answer",
            )
            answers = time.monotonic()
            await wait_for_async(
                lambda: (running_or_none(rehearsal, "ServiceAi-Fast") or 0) >= 2,
                timeout_s=600,
                what="the scale-up the outage asked for",
            )
            scaled = time.monotonic()
        await wait_for_async(
            lambda: rehearsal.serves("ServiceAi-Fast"), timeout_s=60, what="the head's proxy"
        )

    timing = {"in_flight": outcomes, "during": during, "all": load.tally("ServiceAi-Fast")}
    assert [o.kind for o in outcomes] == ["completed", "completed"], timing
    assert set(during) == {"completed"} and set(load.tally("ServiceAi-Fast")) == {"completed"}, (
        timing
    )
    away = [o.ttft_ms for o in load.outcomes if o.started_at < restarted and o.ttft_ms]
    returned = [o.ttft_ms for o in load.outcomes if o.started_at > restarted and o.ttft_ms]
    rehearsal.figures |= {
        "head_away_stream_ttft_ms_p50_max": [round(median(away)), round(max(away))],
        "head_back_stream_ttft_ms_p50_max": [round(median(returned)), round(max(returned))],
        "head_lost_streams_in_flight_completed": f"{len(outcomes)} of {len(outcomes)}",
        "head_lost_streams_served_while_away": f"{during['completed']} of {sum(during.values())}",
        "head_lost_streams_failed_in_all": sum(load.tally("ServiceAi-Fast").values())
        - load.tally("ServiceAi-Fast")["completed"],
        "head_away_s": round(restarted - lost, 1),
        "head_ray_start_s": round(restarted - back, 1),
        "head_back_serve_status_answers_after_s": round(answers - restarted, 1),
        "head_back_scale_up_running_after_s": round(scaled - restarted, 1),
    }


def running_or_none(rehearsal: Rehearsal, deployment: str) -> int | None:
    """Running replicas as `serve status` says, None while it does not answer (no head)."""
    try:
        return running(rehearsal, deployment)
    except (RuntimeError, subprocess.TimeoutExpired):
        return None


def test_a_types_replicas_on_two_nodes_keep_every_conversation_on_its_cache(rehearsal):
    """Prefix affinity across nodes: Fast at two replicas of a whole GPU each, so one per
    gpu_l4 node, and every later turn of a conversation finds its earlier turns cached."""
    # Two more gpu_l4 nodes: a rolling update starts the new replicas before it stops the old
    # one, which holds half of its node's GPU meanwhile. With one more node only, the second
    # new replica waited for a GPU nobody freed (seen: 14 minutes, until a third node joined;
    # in production the cluster's autoscaler adds the node).
    for name in SPARE_L4S:
        rehearsal.cluster.add_node(worker_node_types()["gpu_l4"], name)
    coder = type_args("ServiceAi-Coder")
    rehearsal.deploy(
        model_types={
            "ServiceAi-Fast": {
                "num_gpus_per_shard": 1,
                "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
            },
            # As the rolling update left it: Coder is not restarted again.
            "ServiceAi-Coder": {"engine_args": {**coder["engine_args"], "max_model_len": 256}},
        }
    )
    # Both new replicas start at once, each an engine on two cores beside the others: 62.9 s
    # for the first in one run (146.6-629.6 s for Coder's in the rolling update's runs).
    deployed = time.monotonic()
    wait_for(
        lambda: (
            steady(rehearsal, "ServiceAi-Fast", 2)
            and all(
                r["required_resources"]["GPU"] == 1
                for r in rehearsal.alive_replicas("ServiceAi-Fast")
            )
        ),
        timeout_s=1200,
        interval_s=5,
        what="Fast at two replicas of a whole GPU",
    )
    rehearsal.figures["two_nodes_fast_replicas_up_s"] = round(time.monotonic() - deployed, 1)
    nodes = {n["node_id"]: name for name, n in rehearsal.alive_nodes().items()}
    hosts = [nodes[r["node_id"]] for r in rehearsal.alive_replicas("ServiceAi-Fast")]
    assert len(set(hosts)) == 2 and all(h.startswith("gpu_l4") for h in hosts), hosts

    rng = random.Random(32)
    conversations = [
        [
            {
                "role": "system",
                "content": " ".join(
                    f"{rng.choice('abcdefghij')}{rng.randrange(1000)}" for _ in range(300)
                ),
            }
        ]
        for _ in range(6)
    ]
    misses = []
    for turn in range(3):
        for number, messages in enumerate(conversations):
            messages.append({"role": "user", "content": f"turn {turn} of {number}"})
            response = rehearsal.chat(
                "ServiceAi-Fast", messages=messages, max_tokens=8, temperature=0
            )
            assert response.status_code == 200, response.text
            reply = response.json()
            messages.append(
                {"role": "assistant", "content": reply["choices"][0]["message"]["content"]}
            )
            # Only a conversation's own earlier turns share more than a block with it.
            if turn and not reply["usage"]["prompt_tokens_details"]["cached_tokens"]:
                misses.append((number, turn))
    assert misses == []
