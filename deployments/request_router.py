"""How the ingress picks a model replica: prefix-cache affinity, bounded by load.

The service is stateless: every turn of a conversation resends the whole history, and vLLM
skips the prefill of what its prefix cache holds. That cache is per replica, so turn k+1 is
cheap only on the replica that served turn k. `ServiceRouter` (Serve's public custom-router
API, one instance per deployment handle, in the ingress process) keeps, per replica, the
hashes of the leading blocks of the prompts it sent there, and sends a request to the replica
that holds the longest prefix of its prompt, unless that replica runs `max_imbalance` more
requests than the least busy one (then it spills to the power of two choices).
/v1/responses with `previous_response_id` needs nothing more: the gateway resolves it into
the whole conversation, whose prefix is the previous turn's.

That index is per ingress replica, and the turns of one conversation reach whichever ingress
replica Serve's proxy picks. So a request whose first turn this index finds on no replica goes
to its conversation's home: of the replicas, the one that ranks first for a hash of that first
turn (rendezvous hashing). Every ingress replica ranks them alike, so a new
conversation starts on its home and its later turns return there whatever ingress replica
they pass through; a replica that comes or goes moves only the conversations homed on it.
Hashing alone piles new conversations unevenly, so a first turn starts on the replica ranked
second where that one runs `NEW_HOME_SPREAD` fewer requests than the first (a later turn
through another ingress replica then misses its cache: 89% cached against 90% with two
ingress replicas, bench/NOTES.md). The same load bound applies to a home.

What a replica holds ages out as vLLM's cache evicts: least recently used first, within the
cache's size that the replica reports (`record_routing_stats`), the tail of a prompt before
its head. Replicas that leave (scale-down, a lost node) take their entries with them.

The replicas of a gang (`serving_processes` > 1, deployments.serving_processes) serve one
engine, so one cache: the index, the homes and the load bound count engines, each replica
naming its own in `record_replica_metadata` (a lone replica is an engine of its own), and the
least busy member of the engine chosen takes the request.

Stream feeds (deployments.feed_hub) are pinned to the replica they name; a request that a
replica failed passes over that replica's engine when it is tried again (deployments.wire.AVOID).
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import orjson
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
from ray.util.metrics import Counter

from deployments.wire import AVOID, ENGINE, Api

FEED_TARGET = "feed_for"
"""The keyword of a feed call that names the replica it must reach."""
BLOCK_BYTES = 256
"""A prompt is hashed in blocks of its serialised text this long (some 50-60 tokens)."""
BYTES_PER_TOKEN = 4
"""Serialised prompt text per token, to size a replica's share of the index to its cache."""
DEFAULT_CACHE_TOKENS = 1 << 20
"""A replica's cache size until it reports its own."""
MAX_IMBALANCE = 8
"""Default: a preferred replica running this many more requests than the least busy one is
passed over (bench/NOTES.md, "Prefix affinity")."""
NEW_HOME_SPREAD = 2
"""A new conversation starts on the replica its hash ranks second where that one runs this
many fewer requests than the first: hashing alone piles conversations unevenly, and a turn
that reaches an ingress replica that never saw its conversation still goes to the first rank
(bench/NOTES.md, "New conversations by load")."""
MAX_PENDING = 10_000
"""Requests chosen for but not yet routed that the router remembers (cancelled ones age out)."""
AFFINE_METHODS = frozenset({"stream", "reply"})
"""Calls that fill the replica's cache; the rest (info, prompt_tokens) go anywhere."""

DECISIONS = Counter(
    "serviceai_router_decisions",
    description="Model replicas chosen by the ingress, by why: `affinity` (holds the "
    "conversation so far), `home` (the conversation's home replica: no replica was known to hold "
    "it), `spill` (the one preferred was too busy, or full).",
    tag_keys=("model_type", "decision"),
)


def rendered(api: Api, body: dict[str, Any]) -> tuple[Any, Any]:
    """What the engine renders first, in the order it renders it: tools (chat templates put
    them in the system prompt), then the conversation or prompt."""
    if api == Api.CHAT:
        return body.get("tools"), body.get("messages")
    if api == Api.RESPONSES:
        return [body.get("instructions"), body.get("tools")], body.get("input")
    if api == Api.MESSAGES:
        return [body.get("system"), body.get("tools")], body.get("messages")
    return None, body.get("prompt")


def engine_of(replica: RunningReplica) -> str:
    """The engine a replica serves: its gang's, else its own."""
    return replica.replica_metadata.get(ENGINE) or replica.replica_id.unique_id


def passed_over(
    replicas: list[RunningReplica], avoid: tuple[str, ...] | None
) -> list[RunningReplica]:
    """`replicas` without those `avoid` names (replica ids), which failed this request before,
    and without the others that serve their engines where other engines are left. All of them
    where no other is left: a replica that recovered beats none."""
    if not avoid:
        return replicas
    failed = set(avoid)
    rest = [r for r in replicas if r.replica_id.unique_id not in failed]
    engines = {engine_of(r) for r in replicas if r.replica_id.unique_id in failed}
    return [r for r in rest if engine_of(r) not in engines] or rest or replicas


def adapter_of(body: dict[str, Any]) -> bytes:
    """The LoRA adapter a request names (`model` as `Type:adapter`), else nothing: vLLM's
    cache holds an adapter's prefixes apart from the base model's."""
    model = body.get("model")
    return model.encode() if isinstance(model, str) and ":" in model else b""


UNCACHED_APIS = frozenset({Api.EMBEDDINGS})
"""Requests whose prompts leave nothing in the cache for the next: the power of two alone."""


def prompt_text(api: Api, body: dict[str, Any]) -> bytes:
    """`rendered`, serialised."""
    head, conversation = rendered(api, body)
    return orjson.dumps(head) + orjson.dumps(conversation)


def first_turn_text(api: Api, body: dict[str, Any]) -> bytes:
    """The head of `prompt_text` that every turn of a conversation starts with: up to the end
    of its first user message (the first block of a bare prompt)."""
    head, conversation = rendered(api, body)
    if api != Api.COMPLETION and isinstance(conversation, list):
        for end, message in enumerate(conversation, 1):
            if isinstance(message, dict) and message.get("role") == "user":
                # Without the list's closing bracket, which a longer conversation has further on.
                return orjson.dumps(head) + orjson.dumps(conversation[:end])[:-1]
    text = orjson.dumps(head) + orjson.dumps(conversation)
    return text[:BLOCK_BYTES] if api == Api.COMPLETION else text


def home_key(first_turn: bytes) -> bytes:
    """What names a conversation alike in every process (Python's `hash` of bytes differs)."""
    return hashlib.blake2b(first_turn, digest_size=8).digest()


def homes(key: bytes, engines: Iterable[str]) -> list[str]:
    """The engines in this conversation's order (rendezvous hashing): the same in every
    process, and changed only where an engine leaves or comes."""
    return sorted(
        engines,
        reverse=True,
        key=lambda engine: hashlib.blake2b(key + engine.encode(), digest_size=8).digest(),
    )


def block_hashes(text: bytes, head: int) -> list[int]:
    """Chained hashes of the text's blocks: the i-th names the whole prefix up to block i, so
    one lookup tells whether a replica holds that much of it. A block ends at `head` (the end
    of the first turn), so that every turn of a conversation has its first turn's blocks, the
    last of them partial, and they name that conversation even when all its whole blocks are
    a system prompt that other conversations share."""
    hashes = []
    chained = 0
    for start, end in ((0, head), (head, len(text))):
        for block in range(start, end, BLOCK_BYTES):
            chained = hash((chained, text[block : min(block + BLOCK_BYTES, end)]))
            hashes.append(chained)
    return hashes


def blocks_for(cache_tokens: int) -> int:
    return max(1, cache_tokens * BYTES_PER_TOKEN // BLOCK_BYTES)


DEFAULT_CAPACITY = blocks_for(DEFAULT_CACHE_TOKENS)


class PrefixIndex:
    """Which engine holds which prompt prefixes, each engine's least recently used first."""

    def __init__(self) -> None:
        self._held: dict[str, OrderedDict[int, None]] = {}
        self._owners: dict[int, set[str]] = {}
        self._capacity: dict[str, int] = {}

    def longest(self, hashes: list[int], candidates: set[str]) -> tuple[int, set[str]]:
        """The most blocks of `hashes` any candidate holds, and the candidates that do."""
        owners = self._owners
        for depth in range(len(hashes), 0, -1):
            held_by = owners.get(hashes[depth - 1])
            if held_by:
                found = held_by & candidates
                if found:
                    return depth, found
        return 0, set()

    def add(self, engine: str, hashes: list[int]) -> None:
        """The engine now holds this prompt; its head is used last, so evicted last."""
        held = self._held.setdefault(engine, OrderedDict())
        for block in reversed(hashes):
            if block in held:
                held.move_to_end(block)
            else:
                held[block] = None
                self._owners.setdefault(block, set()).add(engine)
        over = len(held) - self._capacity.get(engine, DEFAULT_CAPACITY)
        for _ in range(max(0, over)):
            block, _ = held.popitem(last=False)
            self._forget(block, engine)

    def size(self, engine: str, cache_tokens: int) -> None:
        """The engine's cache holds this many tokens: it keeps as many blocks' worth."""
        self._capacity[engine] = blocks_for(cache_tokens)

    def drop(self, engine: str) -> None:
        self._capacity.pop(engine, None)
        for block in self._held.pop(engine, ()):
            self._forget(block, engine)

    def engines(self) -> set[str]:
        return set(self._held) | set(self._capacity)

    def blocks(self, engine: str) -> int:
        return len(self._held.get(engine, ()))

    def _forget(self, block: int, engine: str) -> None:
        owners = self._owners.get(block)
        if owners is not None:
            owners.discard(engine)
            if not owners:
                del self._owners[block]


class Routing:
    """What the router knows of one request it has not routed yet."""

    __slots__ = ("hashes", "first_blocks", "home_key", "new", "decision", "preferred")

    def __init__(self, api: Api, body: dict[str, Any]) -> None:
        adapter = adapter_of(body)
        text = adapter + prompt_text(api, body)
        first_turn = adapter + first_turn_text(api, body)
        self.hashes = block_hashes(text, len(first_turn))
        self.new = len(text) <= len(first_turn) + 1  # the first turn: nothing after it
        self.first_blocks = -(-len(first_turn) // BLOCK_BYTES)  # in every later turn
        # An adapter's requests share a home, whatever their conversation: the replicas
        # that hold it in memory serve it, and a burst on it loads it on no other replica
        # until its home is max_imbalance requests busier than the least busy one.
        self.home_key = home_key(adapter or first_turn)
        self.new = self.new and not adapter
        self.decision = "home"
        self.preferred: set[ReplicaID] = set()
        """The replicas `decision` named; another one routed to is a spill."""


class ServiceRouter(RequestRouter):
    """Prefix affinity, else the conversation's home, bounded by load; the power of two choices
    for the rest; feeds pinned."""

    def initialize_state(  # type: ignore[override]  # Ray passes request_router_kwargs by name
        self, model_type: str = "", prefix_affinity: bool = True, max_imbalance: int = MAX_IMBALANCE
    ) -> None:
        self._model_type = model_type
        self._affinity = prefix_affinity
        self._max_imbalance = max_imbalance
        self._index = PrefixIndex()
        self._engines: dict[ReplicaID, str] = {}
        """The engine of each replica (`engine_of`), as last seen."""
        self._pending: OrderedDict[str, tuple[Routing, PendingRequest]] = OrderedDict()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is None:
            return [two_choices(candidate_replicas)]
        # Serve asks again at once, with no pause, unless told to back off (its own routers
        # say so on their last try): a feed whose replica has left would spin the ingress's
        # event loop, and replicas that are all full would be probed without pause.
        pending_request.routing_context.should_backoff = True
        target = pending_request.kwargs.get(FEED_TARGET)
        if target is not None:
            chosen = [r for r in candidate_replicas if r.replica_id.unique_id == target]
            return [chosen] if chosen else []
        candidate_replicas = passed_over(candidate_replicas, pending_request.kwargs.get(AVOID))
        routing = self._routing(pending_request)
        if routing is None:
            return [two_choices(candidate_replicas)]
        members: dict[str, list[RunningReplica]] = {}
        for replica in candidate_replicas:
            engine = self._engines[replica.replica_id] = engine_of(replica)
            members.setdefault(engine, []).append(replica)
        loads = self._loads(members)
        least = min(loads.values(), default=0)
        depth, holders = self._index.longest(routing.hashes, set(members))
        if depth and depth >= routing.first_blocks:
            routing.decision = "affinity"
        else:  # a new conversation, or one that another ingress replica placed
            routing.decision = "home"
            first, *others = homes(routing.home_key, members)
            if (
                routing.new
                and others
                and loads.get(first, least) - loads.get(others[0], least) >= NEW_HOME_SPREAD
            ):
                first = others[0]
            holders = {first}
        # The least busy replica of a preferred engine takes it (Serve's choice within a
        # rank), ties either way (Serve's go to the first).
        preferred = [
            replica
            for engine in holders
            if loads.get(engine, least) - least < self._max_imbalance
            for replica in members[engine]
        ]
        random.shuffle(preferred)
        routing.preferred = {r.replica_id for r in preferred}
        if not preferred:
            routing.decision = "spill"
            return [two_choices(candidate_replicas)]
        # A preferred replica that is full is passed over for the next rank at once.
        return [preferred, two_choices(candidate_replicas)]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        routing, _ = self._pending.pop(pending_request.metadata.internal_request_id, (None, None))
        if routing is None:
            return
        self._index.add(self._engines.get(replica_id, replica_id.unique_id), routing.hashes)
        # A preferred replica that was full gave way to the next rank: that is a spill too.
        decision = routing.decision if replica_id in routing.preferred else "spill"
        DECISIONS.inc(tags={"model_type": self._model_type, "decision": decision})

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        engines = {replica.replica_id: engine_of(replica) for replica in replicas}
        for replica in replicas:
            cache_tokens = (replica.routing_stats or {}).get("cache_tokens")
            if cache_tokens:
                self._index.size(engines[replica.replica_id], cache_tokens)
        for gone in self._index.engines() - set(engines.values()):
            self._index.drop(gone)
        self._engines = engines

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        # A gang's engine goes with any of its members: Serve restarts the whole gang.
        self._index.drop(self._engines.get(replica_id, replica_id.unique_id))

    def _routing(self, pending_request: PendingRequest) -> Routing | None:
        """The prompt's block hashes and the decision so far, kept until the request is
        routed (a request is chosen for again while the replicas it may take are full)."""
        request_id = pending_request.metadata.internal_request_id
        if request_id in self._pending:
            return self._pending[request_id][0]
        args = pending_request.args
        if (
            not self._affinity
            or pending_request.metadata.call_method not in AFFINE_METHODS
            or len(args) < 2
            or args[0] in UNCACHED_APIS
        ):
            return None
        routing = Routing(args[0], args[1])
        pending = self._pending
        # The oldest first: those the caller cancelled before they were routed, or too many.
        # (Not those whose future is done: Serve sets it when it picks a replica, then awaits
        # the replica's acceptance before it calls on_request_routed.)
        while pending and (
            len(pending) >= MAX_PENDING or next(iter(pending.values()))[1].future.cancelled()
        ):
            pending.popitem(last=False)
        pending[request_id] = routing, pending_request
        return routing

    def _loads(self, members: dict[str, list[RunningReplica]]) -> dict[str, int]:
        """Requests running on each engine's replicas, as far as this handle knows (an engine
        none of whose replicas it knows: left out)."""
        cache = self.replica_queue_len_cache
        loads = {}
        for engine, replicas in members.items():
            lengths = (cache.get(r.replica_id) for r in replicas)
            known = [queue_len for queue_len in lengths if queue_len is not None]
            if known:
                loads[engine] = sum(known)
        return loads


def two_choices(replicas: list[RunningReplica]) -> list[RunningReplica]:
    """Two replicas at random: Serve sends the request to the less busy one."""
    return random.sample(replicas, min(2, len(replicas)))  # in random order: ties go either way
