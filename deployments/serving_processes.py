"""A replica's serving processes: vLLM's serving layer in N processes over one engine core.

With `serving_processes: N` a type's replica launches its engine core for N clients
(deployments.vllm_engine.shared_engine) and starts N-1 Ray actors beside it, in its placement
group (so on its node, with their CPUs reserved): each connects to the core as one client and
serves requests as the replica does (deployments.engine_serving). Serve still sees one replica:
it routes, counts, cancels and health-checks calls there. The replica serves requests itself
until it runs `SPREAD_FROM` of them, then sends each to the least busy of its processes, itself
included, and relays the first part of a stream and a whole reply's few parts; the rest of a
stream goes from the serving process to the ingress on the ingress's feed, which the ingress
opens on that process directly (it is a named actor: `feed_name`), as it opens one on a replica
(deployments/feed_hub.py). Rendering, tokenizing, detokenizing and encoding, the work that held
one process at a core on a GPU, is then split N ways, and no token passes through the replica.

Failure: a serving process that dies fails its requests (the ingress hears it as the engine's
failure) and the replica's health check, so Serve replaces the replica; an engine core that
dies is seen by the replica, which ends its serving processes, so no request waits on them.
The serving processes die with the replica (Ray ends the actors a process owns with it).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import aclosing, suppress
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util import get_current_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from deployments.feed_hub import FeedHub
from deployments.wire import SERVING_PROCESS_NAMESPACE, EngineFailed, ReplyPart, feed_name

logger = logging.getLogger("ray.serve")

SPREAD_FROM = int(os.environ.get("SERVICEAI_STREAM_FEED_MIN_STREAMS", "16"))
"""The replica serves requests itself until it runs this many, the streams at which the ingress
opens a feed on one process (the same setting, app/config/settings.py): below, a stream has no
feed to go by, and its parts would pass through the replica. The ingress opens its feed on a
serving process with its first stream there."""
ENGINE_WATCH_S = 0.5
"""How often the replica looks whether its engine core died."""
HEALTH_TIMEOUT_S = 10.0
PROCESS_FAILED = "The model engine failed this request. Retry shortly."


@ray.remote
class ServingProcess:
    """One serving process: a client of its replica's engine core with vLLM's serving layer."""

    async def start(
        self, config: Any, model: str, client: Any, devices: str | None, name: str
    ) -> int:
        """Connect to the core as `client` (returns once the core is up); this process's pid.
        `devices`: the replica's CUDA_VISIBLE_DEVICES, which Ray does not give a process that
        reserves no GPU: vLLM's client configures itself for the platform it sees, as vLLM's
        own API server processes see the engine's."""
        if devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = devices
        from deployments.engine_serving import EngineServing
        from deployments.model_server import engine_options
        from deployments.vllm_engine.engine import VllmEngine

        engine = await VllmEngine.start(
            config.name, config.engine_kwargs(model), **engine_options(config), client=client
        )
        self._serving = EngineServing(engine, FeedHub(config.max_ongoing_requests), replica=name)
        return os.getpid()

    async def stream(
        self, api: str, body: dict, ingress: str | None, key: int
    ) -> AsyncIterator[ReplyPart]:
        async for part in self._serving.stream(api, body, ingress, key):
            yield part

    async def reply(self, api: str, body: dict) -> AsyncIterator[ReplyPart]:
        async for part in self._serving.reply(api, body):
            yield part

    async def feed(self, ingress: str) -> AsyncIterator[list]:
        async for batch in self._serving.feed(ingress):
            yield batch

    async def check_health(self) -> None:
        await self._serving.engine.check_health()

    def running_requests(self) -> int:
        return self._serving.engine.running_requests()


class ServingProcesses:
    """The replica's side: its serving processes (1..N-1; 0 is the replica), the requests each
    runs."""

    def __init__(self, config: Any, model: str, replica: str) -> None:
        self._config = config
        self._model = model
        self._replica = replica
        self.actors: list[Any] = []
        self._starts: list[Any] = []
        self.pids: list[int] = []
        self._load = [0]
        self.served = [0]
        """Requests sent to each process so far (0: the replica)."""
        self._dead: set[int] = set()
        self._watch: asyncio.Task[None] | None = None

    def start(self, clients: list[Any]) -> None:
        """Start a serving process for each engine client (before the core loads: they connect
        as it comes up)."""
        group = get_current_placement_group()
        for n, client in enumerate(clients):
            if group is not None:
                where = PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=self._config.tensor_parallel_size + n
                )
            else:
                node = ray.get_runtime_context().get_node_id()
                where = NodeAffinitySchedulingStrategy(node, soft=False)
            name = feed_name(self._replica, client.index)
            actor = ServingProcess.options(
                name=name,
                namespace=SERVING_PROCESS_NAMESPACE,
                num_cpus=self._config.serving_process_cpus,
                scheduling_strategy=where,
            ).remote()
            self.actors.append(actor)
            devices = os.environ.get("CUDA_VISIBLE_DEVICES")
            self._starts.append(
                actor.start.remote(self._config, self._model, client, devices, name)
            )
            self._load.append(0)
            self.served.append(0)

    async def ready(self, engine: Any) -> None:
        """Wait until every serving process is connected; then watch the engine core."""
        self.pids = list(await asyncio.gather(*self._starts))
        self._watch = asyncio.ensure_future(self._watch_engine(engine))

    def pick(self) -> int:
        """The replica itself (0) below `SPREAD_FROM` requests, else the least busy process."""
        load = self._load
        if load[0] < SPREAD_FROM:
            index = 0
        else:
            index = min((i for i in range(len(load)) if i not in self._dead), key=load.__getitem__)
        self.served[index] += 1
        return index

    async def own(self, parts: AsyncIterator[ReplyPart]) -> AsyncIterator[ReplyPart]:
        """`parts` of a request the replica serves itself, counted as its load."""
        self._load[0] += 1
        try:
            async with aclosing(parts):
                async for part in parts:
                    yield part
        finally:
            self._load[0] -= 1

    async def stream(
        self, index: int, api: str, body: dict, ingress: str | None, key: int
    ) -> AsyncIterator[ReplyPart]:
        """Serving process `index`'s stream of a request, relayed."""
        call = self.actors[index - 1].stream.options(num_returns="streaming")
        async with aclosing(self._relay(index, call.remote(api, body, ingress, key))) as parts:
            async for part in parts:
                yield part

    async def reply(self, index: int, api: str, body: dict) -> AsyncIterator[ReplyPart]:
        call = self.actors[index - 1].reply.options(num_returns="streaming")
        async with aclosing(self._relay(index, call.remote(api, body))) as parts:
            async for part in parts:
                yield part

    async def _relay(self, index: int, call: Any) -> AsyncIterator[Any]:
        self._load[index] += 1
        done = False
        try:
            async for ref in call:
                yield await ref
            done = True
        except RayTaskError as exc:
            done = True
            raise exc.cause from None  # the GenerationError, as the replica would raise it
        except RayActorError:
            done = True
            self._dead.add(index)
            logger.error("Serving process %d of this replica died", index)
            failed = EngineFailed(PROCESS_FAILED)
            failed.replica = self._replica  # being replaced: the ingress passes it over
            raise failed from None
        finally:
            self._load[index] -= 1
            if not done:  # cancelled (the client left): the process aborts the request
                ray.cancel(call)

    async def running_requests(self) -> int:
        """Requests the serving processes' engine clients still hold."""
        return sum(await asyncio.gather(*(a.running_requests.remote() for a in self.actors)))

    async def check_health(self) -> None:
        if self._dead:
            raise RuntimeError(f"serving process(es) {sorted(self._dead)} of this replica died")
        checks = [actor.check_health.remote() for actor in self.actors]
        await asyncio.wait_for(asyncio.gather(*checks), HEALTH_TIMEOUT_S)

    async def _watch_engine(self, engine: Any) -> None:
        """Once the engine core dies, end the serving processes: their clients do not watch
        the core (the replica's does), and their requests would wait on it for ever."""
        while not engine.errored():
            await asyncio.sleep(ENGINE_WATCH_S)
        logger.error("The engine core died: ending this replica's serving processes")
        self.stop()

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for n, actor in enumerate(self.actors, 1):
            self._dead.add(n)
            with suppress(Exception):
                ray.kill(actor, no_restart=True)
