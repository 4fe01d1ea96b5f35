"""Ray's own `ray.serve.llm` on the benchmark's model: the peer issue 5 measures us against.

`serve run` imports `build_app` in a Ray cluster the benchmark starts (bench/servers.py). The
engine arguments are those of the benchmarked type, so all three servers run the same engine.
Direct streaming (`RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1`, read by Ray when it imports
ray.serve.llm) makes the LLM server replica the ingress and serve vLLM's own OpenAI app, with
no handle streaming in between.
"""

from __future__ import annotations

import os
from typing import Any

from ray.serve import Application

# On 2 CPUs Ray's default of 1 CPU per replica leaves the second replica unschedulable: Ray
# Serve LLM adds the replica actor's own CPUs (1 unless `ray_actor_options` say) to the engine's
# placement bundle, so its replicas ask for none and the bundle carries their share.
INGRESS_CPUS = 0.25
ENGINE_CPUS = 0.5


def build_app(args: dict[str, Any]) -> Application:
    from ray.serve.llm import LLMConfig, build_openai_app

    replicas = args.get("num_replicas", 1)
    cpus = ENGINE_CPUS / replicas  # as many replicas as the benchmark asks, on the same cores
    engine_bundle = {"CPU": cpus, "GPU": 1} if args.get("gpu") else {"CPU": cpus}
    deployment: dict[str, Any] = {
        "num_replicas": replicas,
        "max_ongoing_requests": args["max_ongoing_requests"],
        "ray_actor_options": {"num_cpus": 0},
    }
    engine_kwargs = dict(args["engine_args"])
    if args.get("request_router"):
        # Ray's prefix-aware router (bench/prefix_affinity.py), reporting cached tokens as ours.
        deployment["request_router_config"] = {"request_router_class": args["request_router"]}
        engine_kwargs["enable_prompt_tokens_details"] = True
    config = LLMConfig(
        model_loading_config={"model_id": args["model_id"], "model_source": args["model_dir"]},
        engine_kwargs=engine_kwargs,
        placement_group_config={"bundles": [engine_bundle]},
        deployment_config=deployment,
    )
    serving: dict[str, Any] = {"llm_configs": [config]}
    if os.environ.get("RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING") != "1":
        # Direct streaming has no separate ingress, and refuses options for one.
        serving["ingress_deployment_config"] = {"ray_actor_options": {"num_cpus": INGRESS_CPUS}}
    return build_openai_app(serving)
