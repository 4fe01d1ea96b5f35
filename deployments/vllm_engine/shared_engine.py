"""One engine core for several serving processes, as `vllm serve --api-server-count N` runs it.

A replica's serving layer (requests rendered and tokenized, outputs detokenized and encoded)
runs in the process that holds the engine client, and one Python process per engine is the
ceiling of a small model on a fast GPU (bench/results/gpu-h100/). vLLM's multi-API-server
mode lifts it: one engine core process, N front-end processes, each an `AsyncLLM` client with
its own pair of ZMQ sockets (`client_index` i of `client_count` N), the core routing each
request's outputs back to the client that sent it. Here the gang's first replica is client 0:
it allocates the N socket addresses, hands the others to the gang's other replicas
(deployments.serving_processes), launches the core and connects last; the others connect as
their client and watch the core (`watch_core`). The private vLLM functions used are listed in
`vllm_internals`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.utils import (
    EngineZmqAddresses,
    get_engine_zmq_bind_addresses,
    launch_core_engines,
)
from vllm.v1.executor import Executor

from deployments.process_watch import first_to_end


class EngineClient(NamedTuple):
    """Client `rank` of `clients` of one engine core: the sockets it binds (IPC paths)."""

    rank: int
    clients: int
    input_address: str
    output_address: str


class SharedEngine:
    """The engine core of one replica, with a client slot for each of its serving processes."""

    def __init__(self, args: AsyncEngineArgs, count: int) -> None:
        self.args = args
        self.count = count
        args._api_process_count = count
        args._api_process_rank = -1  # the launcher, as `vllm serve` marks its parent process
        self.config = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
        bind = get_engine_zmq_bind_addresses(self.config, count)
        self.clients = [
            EngineClient(i, count, bind.inputs[i], bind.outputs[i]) for i in range(count)
        ]
        self.manager: Any = None

    def launch(self) -> None:
        """Start the engine core and wait until it is ready (its model loaded); the clients
        connect to it once they bind their sockets, before or after."""
        addresses = EngineZmqAddresses(
            inputs=[c.input_address for c in self.clients],
            outputs=[c.output_address for c in self.clients],
        )
        executor = Executor.get_class(self.config)
        with launch_core_engines(
            self.config, executor, not self.args.disable_log_stats, addresses
        ) as launched:
            self.manager = launched.engine_manager

    def first_client(self, stat_loggers: list[Any]) -> AsyncLLM:
        """Client 0, in the launcher's process: it owns the core as a lone `AsyncLLM` does (it
        shuts the core down with itself, and vLLM's monitor marks it dead when the core dies)."""
        engine = connect(self.args, self.config, self.clients[0], stat_loggers)
        engine.engine_core.resources.engine_manager = self.manager
        engine.engine_core.start_engine_core_monitor()
        return engine


def watch_core(engine: AsyncLLM, pids: Sequence[int]) -> None:
    """A client of a core another process launched learns of the core's death as client 0 does
    from vLLM's monitor: the client is marked dead and shut down, so that its requests fail at
    once with vLLM's EngineDeadError (and its health check) instead of waiting for outputs that
    never come. `pids`: the core's processes (on this node: the clients reach it by IPC)."""
    client = weakref.ref(engine.engine_core)

    def watch() -> None:
        if not first_to_end(pids, lambda: client() is None):
            return  # the engine was shut down and collected
        core = client()
        if core is None or core.resources.engine_dead:
            return
        core.resources.engine_dead = True
        core.shutdown()

    threading.Thread(target=watch, daemon=True, name="ServiceAiCoreWatch").start()


def client_engine(args: AsyncEngineArgs, client: EngineClient, stat_loggers: list[Any]) -> AsyncLLM:
    """A serving process's client of a core another process launched: returns once the core
    answered (it waits for the core's start)."""
    args._api_process_count = client.clients
    args._api_process_rank = client.rank
    config = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    return connect(args, config, client, stat_loggers)


def connect(
    args: AsyncEngineArgs, config: Any, client: EngineClient, stat_loggers: list[Any]
) -> AsyncLLM:
    return AsyncLLM(
        vllm_config=config,
        executor_class=Executor.get_class(config),
        log_requests=args.enable_log_requests,
        log_stats=not args.disable_log_stats,
        usage_context=UsageContext.OPENAI_API_SERVER,
        stat_loggers=stat_loggers,
        client_addresses={
            "input_address": client.input_address,
            "output_address": client.output_address,
        },
        client_count=client.clients,
        client_index=client.rank,
    )
