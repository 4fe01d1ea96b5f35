"""One vLLM engine and vLLM's own OpenAI serving layer over it: one model type's replica.

The folder's entry point, and with it the only code that imports vLLM. Built as `vllm serve`
builds its server (`init_app_state`, as Ray Serve LLM builds it inside its replicas), with the
engine client wrapped to count tokens (`counting`); every request then goes through one
driver (`replies.serve`) whatever its API (`completions`, `responses`, `messages`,
`embeddings`).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from starlette.datastructures import State
from vllm.config import PoolerConfig, ReasoningConfig, StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.cli_args import FrontendArgs
from vllm.entrypoints.openai.models.protocol import LoRAModulePath
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

from deployments.model_type import ToolStrictLevel
from deployments.priority_gate import PriorityGate
from deployments.vllm_engine import forced_tool_calls, replies
from deployments.vllm_engine.adapters import RuntimeAdapters
from deployments.vllm_engine.completions import ChatApi, CompletionApi
from deployments.vllm_engine.counting import counting_client
from deployments.vllm_engine.embeddings import EmbeddingsApi
from deployments.vllm_engine.messages import MessagesApi
from deployments.vllm_engine.replies import ServedApi
from deployments.vllm_engine.shared_engine import (
    EngineClient,
    SharedEngine,
    client_engine,
    watch_core,
)
from deployments.wire import ADAPTER_PATH, GRAMMAR_PARAM, Api, GenerationError, ModelInfo, ReplyPart

logger = logging.getLogger("ray.serve.serviceai")  # into the replica's Serve log

TEMPLATE_PROBE: dict[str, Any] = {
    "messages": [{"role": "user", "content": ""}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "none",  # the tools are rendered all the same; no parser needed
}
"""A conversation with no text of its own: its tokens are what the chat template adds by
itself (a default system prompt, the tool-calling preamble, the generation prompt)."""


def frontend_args(
    engine_args: AsyncEngineArgs,
    *,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    chat_template: str | None,
    tool_strict_level: ToolStrictLevel,
    adapters: dict[str, str] | None = None,
) -> argparse.Namespace:
    """The flat namespace vLLM's `init_app_state` reads (as `vllm serve` parses it); each of
    `adapters` (a path by served name) as `--lora-modules` names one."""
    frontend = FrontendArgs(
        lora_modules=[LoRAModulePath(name, path) for name, path in (adapters or {}).items()]
        or None,
        enable_auto_tool_choice=tool_call_parser is not None,
        tool_call_parser=tool_call_parser,
        tool_strict_level=tool_strict_level,
        chat_template=chat_template,
        enable_prompt_tokens_details=True,
        disable_uvicorn_access_log=True,
    )
    if isinstance(engine_args.structured_outputs_config, dict):  # as a config file writes it
        engine_args.structured_outputs_config = StructuredOutputsConfig(
            **engine_args.structured_outputs_config
        )
    if isinstance(engine_args.pooler_config, dict):
        engine_args.pooler_config = PoolerConfig(**engine_args.pooler_config)
    if isinstance(engine_args.reasoning_config, dict):
        engine_args.reasoning_config = ReasoningConfig(**engine_args.reasoning_config)
    if reasoning_parser:
        engine_args.reasoning_parser = reasoning_parser
        engine_args.create_structured_outputs_config()
    return argparse.Namespace(**(vars(frontend) | vars(engine_args)))


class VllmEngine:
    """One vLLM engine and its OpenAI serving layer, serving one model type."""

    def __init__(
        self,
        name: str,
        engine: AsyncLLM,
        state: State,
        *,
        tool_call_parser: str | None,
        reasoning_parser: str | None,
        parser: str,
        tool_strict_level: ToolStrictLevel,
    ) -> None:
        """`tool_call_parser` as configured; `parser`: the one vLLM runs (forced_tool_calls)."""
        self.name = name
        self._engine = engine
        self._apis = served_apis(state)
        self._models = state.openai_serving_models
        self._runtime_adapters = RuntimeAdapters(name, self._models, engine)
        self.lora = engine.vllm_config.lora_config is not None
        self.embedding = Api.EMBEDDINGS in self._apis
        self._responses: Any = None  # vLLM's Responses handler, built on first use
        self._parser = parser
        self._tool_strict_level = tool_strict_level
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        self.adapters: tuple[str, ...] = ()
        self.max_model_len: int = engine.model_config.max_model_len
        self.template_tokens = 0
        self.gate: PriorityGate | None = None

    @classmethod
    async def start(
        cls,
        name: str,
        engine_kwargs: dict[str, Any],
        *,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        chat_template: str | None = None,
        tool_strict_level: ToolStrictLevel = "parameter",
        reserved_slots: int | None = None,
        busy_stream_interval: int = 1,
        serving_processes: int = 1,
        start_others: Callable[[list[EngineClient]], None] | None = None,
        client: EngineClient | None = None,
        adapters: dict[str, str] | None = None,
    ) -> VllmEngine:
        """Build the engine and the serving layer, serving the model as `name`; returns once
        the model is loaded. vLLM's engine metrics (vllm:*) go out through Ray's metrics API,
        beside the ingress's. An engine with `scheduling_policy: priority` admits requests in
        priority order, `reserved_slots` of its max_num_seqs kept for priority 0
        (deployments.priority_gate; default an eighth), a later plan's streams
        `busy_stream_interval` tokens a chunk while the later plans fill their slots.

        With `serving_processes` N > 1 this process launches an engine core for N clients
        (deployments.vllm_engine.shared_engine), calls `start_others` with the other N-1
        clients' sockets before the core loads, and is client 0; another replica of its gang
        passes its `client` instead. Each of the N gates its requests with its share of the
        engine's slots (the router spreads requests evenly over them)."""
        args = AsyncEngineArgs(**_for_this_platform(engine_kwargs))
        parser = forced_tool_calls.install(tool_call_parser)
        namespace = frontend_args(
            args,
            tool_call_parser=parser,
            reasoning_parser=reasoning_parser,
            chat_template=chat_template,
            tool_strict_level=tool_strict_level,
            adapters=adapters,
        )
        # The defaults `vllm serve` gets (max_num_batched_tokens: 8192 on an H100, not 2048).
        loggers: list[Any] = [RayPrometheusStatLogger]
        if client is not None:
            engine = client_engine(args, client, loggers)
        elif serving_processes > 1:
            shared = SharedEngine(args, serving_processes)
            if start_others is not None:
                start_others(shared.clients[1:])
            shared.launch()
            engine = shared.first_client(loggers)
        else:
            engine = AsyncLLM.from_engine_args(
                args, usage_context=UsageContext.OPENAI_API_SERVER, stat_loggers=loggers
            )
        gate = None
        scheduler = engine.vllm_config.scheduler_config
        if scheduler.policy == "priority":
            share = client.clients if client is not None else serving_processes
            slots = max(1, scheduler.max_num_seqs // share)
            kept = reserved_slots
            reserved = max(1, slots // 8) if kept is None else -(-kept // share)  # rounded up
            gate = PriorityGate(slots, reserved, busy_stream_interval=busy_stream_interval)
        state = State()
        await init_app_state(
            counting_client(engine, gate.stream_interval if gate else None),
            state,
            namespace,
            supported_tasks=await engine.get_supported_tasks(),
        )
        # vLLM's error path reads the uvicorn server its own launcher would have set.
        state.server = argparse.Namespace(should_exit=False)
        served = cls(
            name,
            engine,
            state,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            parser=parser,
            tool_strict_level=tool_strict_level,
        )
        served.gate = gate
        served.adapters = tuple(adapters or ())
        if served.embedding:
            return served
        try:
            served.template_tokens = await served.prompt_tokens(Api.CHAT, TEMPLATE_PROBE)
        except GenerationError as exc:
            # Unknown: the ingress then measures every prompt before admitting it.
            logger.warning("The chat template's own length is unknown (%s)", exc.message)
            served.template_tokens = served.max_model_len
        return served

    def serve(
        self, api: Api, body: dict[str, Any], *, batched: bool = True
    ) -> AsyncGenerator[ReplyPart, None]:
        """A request of `api`:
        see `replies.serve`; under priority scheduling, once the gate gives it a slot per
        sequence it runs. A registered adapter it names is loaded first, unless held."""
        path = body.pop(ADAPTER_PATH, None)
        grammar = body.pop(GRAMMAR_PARAM, None)
        parts = replies.serve(self._api(api, body), body, batched=batched, grammar=grammar)
        if path is not None:
            parts = self._runtime_adapters.loaded_first(body["model"], path, parts)
        return self.gated(api, body, parts)

    def gated(
        self, api: Api, body: dict[str, Any], parts: AsyncGenerator[ReplyPart, None]
    ) -> AsyncGenerator[ReplyPart, None]:
        """`parts` of a request of `api`, once the priority gate (if any) gives it its slots."""
        if self.gate is None:
            return parts
        return self._gated(parts, body.get("priority", 0), sequences(api, body))

    async def _gated(
        self, parts: AsyncGenerator[ReplyPart, None], priority: int, size: int
    ) -> AsyncGenerator[ReplyPart, None]:
        assert self.gate is not None  # gated() passes through when there is none
        async with self.gate.slot(priority, size), aclosing(parts):
            async for part in parts:
                yield part

    async def prompt_tokens(self, api: Api, body: dict[str, Any]) -> int:
        """The prompt's tokens as the serving layer renders them for generation (the longest
        prompt of a completion request), nothing generated: raises the `GenerationError`
        generation would, a prompt beyond the context included."""
        path = body.pop(ADAPTER_PATH, None)
        if path is not None:
            await self._runtime_adapters.load(body["model"], path)
        # Not popped: in the ingress's own process the same body is then served.
        body = {name: value for name, value in body.items() if name != GRAMMAR_PARAM}
        return await replies.prompt_tokens(self._api(api, body), body)

    def _api(self, api: Api, body: dict[str, Any]) -> ServedApi:
        if api != Api.RESPONSES or self.embedding:
            return self._apis[api]  # the ingress sends an embedding type embeddings alone
        # Imported on first use, as the handler is built: the GPU bench's vLLM 0.26 lacks it.
        from deployments.vllm_engine.responses import ResponsesApi, build_serving

        if self._responses is None:
            self._responses = build_serving(
                self._engine,
                self._models,
                self._parser,
                self._tool_strict_level,
                self.reasoning_parser,
            )
        return ResponsesApi(self._responses, body)

    def info(self) -> ModelInfo:
        return ModelInfo(
            self.name,
            self.max_model_len,
            self.tool_call_parser,
            self.reasoning_parser,
            self.template_tokens,
            self.gate is not None,
            self.embedding,
            self.adapters,
            self.lora,
        )

    async def check_health(self) -> None:
        """Raise if the engine core is dead, so that Serve replaces this replica."""
        await self._engine.check_health()

    def errored(self) -> bool:
        """The engine core died (or this client's output handler did)."""
        return self._engine.errored

    def cache_tokens(self) -> int:
        """How many tokens the engine's KV cache (and so its prefix cache) holds."""
        cache = self._engine.vllm_config.cache_config
        return (cache.num_gpu_blocks or 0) * cache.block_size

    def running_requests(self) -> int:
        return self._engine.output_processor.get_num_unfinished_requests()

    def watch_core(self, pids: tuple[int, ...]) -> None:
        """Fail this client's requests at once when the core another process launched dies."""
        watch_core(self._engine, pids)

    def core_pids(self) -> tuple[int, ...]:
        """The engine-core processes this engine started (not found by title: vLLM sets that late)."""
        manager = self._engine.engine_core.resources.engine_manager
        return () if manager is None else tuple(p.pid for p in manager.processes)

    def shutdown(self) -> None:
        self._engine.shutdown()


def served_apis(state: State) -> dict[Api, ServedApi]:
    """The APIs of the serving layer vLLM built for this model: a generating model's chat,
    completions and messages (responses is built on first use), or an embedding model's
    embeddings alone."""
    embedding = getattr(state, "serving_embedding", None)
    if embedding is not None:
        return {Api.EMBEDDINGS: EmbeddingsApi(embedding)}
    return {
        Api.CHAT: ChatApi(state.openai_serving_chat),
        Api.COMPLETION: CompletionApi(state.openai_serving_completion),
        Api.MESSAGES: MessagesApi(state.anthropic_serving_messages),
    }


def sequences(api: Api, body: dict[str, Any]) -> int:
    """The sequences the engine runs at once for a request: `n` of each prompt (a completion's
    prompt may be a list of prompts, each a string or a list of token ids), or one per input
    of an embedding request."""
    prompt = body.get({Api.COMPLETION: "prompt", Api.EMBEDDINGS: "input"}.get(api, ""))
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return (body.get("n") or 1) * len(prompt)
    return body.get("n") or 1


def _for_this_platform(engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's CPU build needs here.

    One shard runs unbound. vLLM's automatic binding gives its worker the replica's CPUs less
    one kept for the scheduler, and every replica of a node sees all the node's CPUs: with
    several engines on one machine (the local profile's four types, a type's replicas in a
    rehearsal or a benchmark) every worker was pinned to the same core, while the others
    idled. Unbound, a worker runs the threads Ray gives the replica's CPU share
    (OMP_NUM_THREADS: its whole CPUs, at least one) wherever the kernel finds room.

    One shard also runs in its engine core's process (vLLM's uniprocess executor). The CPU
    build otherwise gives it a worker process of its own, and the two pass each step through a
    shared-memory queue whose readers spin (`sched_yield`) for a second after every message:
    the engine core spins while its worker runs the step, the worker between steps. On a
    machine with fewer cores than engines those spinners take the cores the workers compute on.

    Tensor-parallel shards: the CPU build refuses the Ray executor ("current platform cpu
    does not support ray"), so they run as local processes, on the node where Serve placed
    the replica's STRICT_PACK bundles, each bound to its own CPUs (one NUMA node is not
    enough for vLLM's automatic binding).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return engine_kwargs
    if engine_kwargs.get("distributed_executor_backend") != "ray":
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # vLLM's CPU platform keeps "uni" only where this says no multiprocessing; AsyncLLM
        # still runs its engine core in a process of its own.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return engine_kwargs
    shards = int(engine_kwargs.get("tensor_parallel_size", 1))
    cpus = sorted(os.sched_getaffinity(0))
    per_shard = [cpus[i::shards] or cpus for i in range(shards)]
    os.environ.setdefault(
        "VLLM_CPU_OMP_THREADS_BIND", "|".join(",".join(map(str, s)) for s in per_shard)
    )
    return {**engine_kwargs, "distributed_executor_backend": "mp"}
