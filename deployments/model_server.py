"""The Ray Serve deployment of one model type: each replica holds one vLLM engine.

Every API (chat, completion, responses) is served the same way: a whole reply by `reply`, a
stream by `stream`, a prompt measured by `prompt_tokens`; the replica's adapter
(deployments.vllm_engine) tells the APIs apart.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application

from deployments import ray_internals
from deployments.deployment_options import engine_kwargs, serve_options
from deployments.engine_serving import EngineServing
from deployments.feed_hub import FeedHub, FeedItem
from deployments.garbage_collection import collect_less_often
from deployments.model_type import ModelTypeConfig, generated_model
from deployments.replica_log import kept_through_logging_setup
from deployments.serving_processes import Gang
from deployments.wire import ENGINE, Api, ModelInfo, ReplyPart

logger = logging.getLogger("ray.serve")


@serve.deployment
class ModelServer:
    """Serves OpenAI requests of one model type with vLLM's own serving layer.

    Options come from `ModelTypeConfig.serve_options`; the served model name is the type's.
    """

    async def __init__(self, config: ModelTypeConfig) -> None:  # type: ignore[misc]  # Serve awaits it
        collect_less_often()
        ray_internals.check()
        self._replica = serve.get_replica_context().replica_id.unique_id
        self._grace_s = config.graceful_shutdown_timeout_s
        self._gang: Gang | None = None
        if config.serving_processes > 1:
            # One of the gang of replicas that serve one engine (deployments.serving_processes).
            self._gang = Gang(serve.get_replica_context().gang_context)
            self._engine = await self._gang.start(partial(start_engine, config))
        else:
            self._engine = await start_engine(config)
        self._feeds = FeedHub(config.max_ongoing_requests)
        self._serving = EngineServing(self._engine, self._feeds, self._replica)
        self._served = 0
        logger.info(
            "%s ready: max_model_len=%d, serving process %d of %d",
            config.name,
            self._engine.max_model_len,
            0 if self._gang is None else self._gang.rank,
            config.serving_processes,
        )

    async def stream(
        self,
        api: Api,
        body: dict,
        ingress: str | None = None,
        key: int = 0,
        avoid: tuple[str, ...] = (),
    ) -> AsyncIterator[ReplyPart]:
        """A streamed request of `api` from ingress replica `ingress` (its request `key`):
        batches of SSE events, or, while that ingress has a feed open here, the first part
        alone and the rest on the feed (deployments.engine_serving). `avoid` is the request
        router's (deployments.wire.AVOID)."""
        self._served += 1
        async for part in self._serving.stream(api, body, ingress, key):
            yield part

    async def feed(self, ingress: str, feed_for: str) -> AsyncIterator[list[FeedItem]]:
        """The feed of ingress replica `ingress` (`feed_for`, this replica, routes it here)."""
        async for batch in self._serving.feed(ingress):
            yield batch

    async def reply(
        self, api: Api, body: dict, avoid: tuple[str, ...] = ()
    ) -> AsyncIterator[ReplyPart]:
        """A whole request of `api`: the token counts so far every second or so while the
        engine works (parts without data), then the JSON body, in parts up to its `last`.
        `avoid`: as `stream`'s."""
        self._served += 1
        async for part in self._serving.reply(api, body):
            yield part

    async def info(self) -> ModelInfo:
        return self._engine.info()

    async def prompt_tokens(self, api: Api, body: dict) -> int:
        """The prompt's length in tokens, rendered and checked as for generation, without
        generating: the ingress asks before it admits a long prompt."""
        return await self._engine.prompt_tokens(api, body)

    async def running_requests(self) -> int:
        """Requests this replica's engine client still holds; tests use it to prove that
        aborts free the engine."""
        return self._engine.running_requests()

    async def served(self, avoid: tuple[str, ...] = ()) -> tuple[str, int, int, int]:
        """This replica's id and pid, the requests it has taken and those its engine client
        still holds: tests read each member of a gang, passing over (`avoid`) those read."""
        return self._replica, os.getpid(), self._served, self._engine.running_requests()

    async def process_ids(self) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        """This replica's pid, its engine core's pids and, in a gang, the other members'
        pids; tests kill them to prove recovery."""
        if self._gang is None:
            return os.getpid(), self._engine.core_pids(), ()
        return os.getpid(), self._gang.core, tuple(self._gang.others())

    def record_replica_metadata(self) -> dict[str, str]:
        """What the ingress's request router knows of this replica for good: in a gang, the
        engine it shares (deployments.wire.ENGINE)."""
        return {} if self._gang is None else {ENGINE: self._gang.id}

    def record_routing_stats(self) -> dict[str, int]:
        """What the ingress's request router learns of this replica: the size of its prefix
        cache, in tokens (deployments.request_router)."""
        return {"cache_tokens": self._engine.cache_tokens()}

    async def check_health(self) -> None:
        await self._engine.check_health()

    def __del__(self) -> None:
        gang = getattr(self, "_gang", None)
        if gang is not None:
            gang.outlive_others(self._grace_s)
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()


def local_model(config: ModelTypeConfig) -> str:
    """The type's model as this node's engine loads it: a path or a Hugging Face id."""
    model = config.resolved_model()
    return str(generated_model(model) or model)


async def start_engine(config: ModelTypeConfig, **options: Any) -> Any:
    """The type's engine and vLLM's serving layer over it (a `VllmEngine`), started in this
    process: a replica's, or the ingress's for a type `in_ingress`; `options` are
    `VllmEngine.start`'s beyond the type's own. Returns once the model is loaded."""
    from deployments.vllm_engine import vllm_internals
    from deployments.vllm_engine.engine import VllmEngine

    vllm_internals.check()
    config = config.as_run()
    logger.info("Starting the engine of %s on %s", config.name, config.model)
    with kept_through_logging_setup():
        return await VllmEngine.start(
            config.name,
            engine_kwargs(config, local_model(config)),
            **engine_options(config),
            **options,
        )


def engine_options(config: ModelTypeConfig) -> dict[str, Any]:
    """The model type's options of `VllmEngine.start`, beside its engine args."""
    return {
        "tool_call_parser": config.tool_call_parser,
        "reasoning_parser": config.reasoning_parser,
        "chat_template": config.chat_template,
        "tool_strict_level": config.tool_strict_level,
        "reserved_slots": config.reserved_slots,
        "busy_stream_interval": config.busy_stream_interval,
        "adapters": config.adapter_paths(),
    }


def build_model_app(config: ModelTypeConfig) -> Application:
    """Bind the model deployment of one model type with its Serve options."""
    return ModelServer.options(**serve_options(config)).bind(config)  # type: ignore[attr-defined]


@serve.deployment(
    name="ModelTypeApp", num_replicas=1, max_surge_percent=100, ray_actor_options={"num_cpus": 0}
)
class ModelTypeApp:
    """The ingress of a model type deployed as an application of its own; it serves nothing.

    Serve (under HAProxy) refuses a custom request router on an application's ingress
    deployment, and the model deployment needs its own (deployments.request_router): so the
    model deployment is this one's child, which the service's ingress calls by its name.
    """

    def __init__(self, model: Any) -> None:
        self._model = model


def build_model_type_app(config: ModelTypeConfig) -> Application:
    """One model type as an application of its own (serve_config.production.yaml)."""
    return ModelTypeApp.bind(build_model_app(config))  # type: ignore[attr-defined]


def ensure_local_model(config: ModelTypeConfig) -> Path | None:
    """Generate the type's model up front when it is a generated one (keeps replica start
    fast)."""
    return generated_model(config.resolved_model())
