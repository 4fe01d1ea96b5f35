"""A type's serving processes: vLLM's serving layer in N Serve replicas over one engine core.

With `serving_processes: N` the type's deployment runs in gangs of N replicas (Serve's gang
scheduling, `ModelTypeConfig.serve_options`), each gang one engine. Rank 0 launches the engine
core for N clients (deployments.vllm_engine.shared_engine) and is client 0; each other member
connects as client `rank`. Serve sees N ordinary replicas: its request router sends each
request straight to one, which serves it as a replica of one process does (its feeds to the
ingress, its share of the priority gate's slots), so all the per-request work that held one
process per engine at a core on a GPU (Serve's request handling, rendering, tokenizing,
detokenizing, encoding) is split N ways. The earlier design, serving processes as actors behind
one replica that still took every request, freed little of that process (bench/NOTES.md).

The members meet through a named actor of their gang (`Meeting`): each registers its node and
GPUs; rank 0 checks that every member shares its node (the clients reach the core by IPC
sockets) and its GPUs (each member reserved a fraction of them, which Serve's best-effort
packing does not promise to take from one GPU), then hands the others their client's sockets
and, once the core is up, its processes.

Failure: a member that dies has Serve restart its whole gang (RESTART_GANG, Serve's policy):
the engine's other clients go with it, and so does a member's failed health check. Every member
sees the core's death (rank 0 by vLLM's own monitor, the others by `watch_core`): their requests
fail at once with the engine's error. Rank 0 stops the core only once the other members have
ended, so that requests they still drain can finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import psutil
import ray

from deployments.process_watch import first_to_end

logger = logging.getLogger("ray.serve")

MEET_POLL_S = 0.2
MEETING_NAMESPACE = "serviceai"


class Member(NamedTuple):
    """One replica of a gang, as it registers at the meeting."""

    rank: int
    pid: int
    node: str
    devices: str | None
    """CUDA_VISIBLE_DEVICES as Ray set it from the member's reservation (None without a GPU)."""


@ray.remote(num_cpus=0)
class Meeting:
    """Where the replicas of one gang find each other: members, the engine's clients, its core."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._members: dict[int, Member] = {}
        self._clients: list[Any] | None = None
        self._core: tuple[int, ...] | None = None
        self._refused: str | None = None

    def register(self, member: Member) -> None:
        self._members[member.rank] = member

    def members(self) -> tuple[list[Member] | None, str | None]:
        """Every member, once all have registered."""
        if len(self._members) < self._size:
            return None, self._refused
        return [self._members[rank] for rank in sorted(self._members)], self._refused

    def refuse(self, reason: str) -> None:
        self._refused = reason

    def hand_out(self, clients: list[Any]) -> None:
        self._clients = clients

    def clients(self) -> tuple[list[Any] | None, str | None]:
        return self._clients, self._refused

    def core_started(self, pids: tuple[int, ...]) -> None:
        self._core = pids

    def core(self) -> tuple[tuple[int, ...] | None, str | None]:
        return self._core, self._refused


def _end_if_gone(pids: list[int], started: threading.Event) -> None:
    """Until `started` is set, end this process the moment one of `pids` (the engine core,
    rank 0) ends: a member still starting when its gang lost them could never finish, and
    Serve restarts a gang only with every member (a member that fails its start stops the
    others; one left starting beside a stopped gang would hold the deployment at an odd count
    of replicas for good)."""

    def watch() -> None:
        if not first_to_end(pids, started.is_set) or started.is_set():
            return
        logger.error("The gang's engine core or first replica ended while this one started")
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="ServiceAiGangStart").start()


class GangRefused(RuntimeError):
    """The gang's members cannot share one engine where Serve put them; Serve starts it again."""


class Gang:
    """This replica's place in its gang, and the others'."""

    def __init__(self, context: Any) -> None:
        self.id: str = context.gang_id
        self.rank: int = context.rank
        self.size: int = context.world_size
        self._meeting = Meeting.options(  # type: ignore[attr-defined]  # a Ray actor class
            name=f"gang-{context.gang_id}", namespace=MEETING_NAMESPACE, get_if_exists=True
        ).remote(self.size)
        self.members: list[Member] = []
        self.core: tuple[int, ...] = ()

    async def start(self, start_engine: Callable[..., Awaitable[Any]]) -> Any:
        """This member's engine: rank 0 launches the core and is client 0, the others connect.
        `start_engine(**options)` starts one with `VllmEngine.start`'s options."""
        me = Member(
            self.rank,
            os.getpid(),
            ray.get_runtime_context().get_node_id(),
            os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
        await self._meeting.register.remote(me)
        if self.rank == 0:
            return await self._launch(me, start_engine)
        clients = await self._wait(self._meeting.clients)
        # Connect once the core is up (it serves client 0 by then): a client of a core that is
        # gone would wait for its greeting for vLLM's start-up timeout (600 s).
        self.core = await self._wait(self._meeting.core)
        self.members = await self._wait(self._meeting.members)
        started = threading.Event()
        _end_if_gone([*self.core, self.members[0].pid], started)
        engine = await start_engine(client=clients[self.rank - 1])
        started.set()
        engine.watch_core(self.core)
        return engine

    async def _launch(self, me: Member, start_engine: Callable[..., Awaitable[Any]]) -> Any:
        self.members = await self._wait(self._meeting.members)
        apart = [m for m in self.members if (m.node, m.devices) != (me.node, me.devices)]
        if apart:
            reason = (
                f"gang member(s) {[m.rank for m in apart]} landed on another node or GPU than "
                f"rank 0 ({me.node[:8]}, GPUs {me.devices}); the gang is started again"
            )
            await self._meeting.refuse.remote(reason)
            raise GangRefused(reason)
        engine = await start_engine(
            serving_processes=self.size, start_others=self._meeting.hand_out.remote
        )
        self.core = engine.core_pids()
        await self._meeting.core_started.remote(self.core)
        return engine

    async def _wait(self, ask: Any) -> Any:
        """Poll the meeting until it has what `ask` returns (a refusal raises)."""
        while True:
            found, refused = await ask.remote()
            if refused is not None:
                raise GangRefused(refused)
            if found is not None:
                return found
            await asyncio.sleep(MEET_POLL_S)

    def others(self) -> list[int]:
        """The pids of the gang's other members."""
        return [m.pid for m in self.members if m.rank != self.rank]

    def outlive_others(self, timeout_s: float) -> None:
        """Rank 0, stopping: wait (up to `timeout_s`) until the other members have ended, so
        that the core they share serves what they still drain."""
        if self.rank != 0:
            return
        alive = []
        for pid in self.others():
            try:
                alive.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        if alive:
            psutil.wait_procs(alive, timeout=timeout_s)
