"""The ingress's choice of model replica: prefix affinity, else the conversation's home,
bounded by load; feeds pinned."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import NamedTuple

import pytest

from deployments import request_router
from deployments.request_router import (
    BLOCK_BYTES,
    FEED_TARGET,
    NEW_HOME_SPREAD,
    PrefixIndex,
    Routing,
    ServiceRouter,
    block_hashes,
    first_turn_text,
    homes,
    prompt_text,
)
from deployments.wire import AVOID, ENGINE


class ReplicaKey(NamedTuple):
    """Stands for Serve's ReplicaID: hashable, with its `unique_id`."""

    unique_id: str


def replica(name: str, gang: str | None = None) -> SimpleNamespace:
    """Stands for Serve's RunningReplica; in `gang`, one of its replicas over one engine."""
    return SimpleNamespace(
        replica_id=ReplicaKey(name),
        routing_stats={},
        replica_metadata={ENGINE: gang} if gang else {},
    )


class Router(ServiceRouter):
    """The router's choices without Serve's machinery: queue lengths are what the test says."""

    replica_queue_len_cache = None  # Serve's property, replaced by the test's own lengths

    def __init__(self, max_imbalance: int = 4) -> None:
        self.initialize_state(model_type="T", max_imbalance=max_imbalance)
        self.replica_queue_len_cache = {}
        self.counted: list[str] = []

    def routed(self, request: SimpleNamespace, chosen: SimpleNamespace) -> None:
        self.on_request_routed(request, chosen.replica_id, None)


def chat(*turns: str, request_id: str = "r") -> SimpleNamespace:
    messages = [{"role": "system", "content": "s" * 2000}]
    messages += [{"role": "user", "content": turn} for turn in turns]
    return pending(("chat", {"messages": messages}), request_id=request_id)


def pending(
    args: tuple, call_method: str = "stream", request_id: str = "r", **kwargs
) -> SimpleNamespace:
    """Stands for Serve's PendingRequest."""
    return SimpleNamespace(
        args=args,
        kwargs=kwargs,
        metadata=SimpleNamespace(internal_request_id=request_id, call_method=call_method),
        routing_context=SimpleNamespace(should_backoff=False),
        future=Future(),
    )


@pytest.fixture(autouse=True)
def decisions(monkeypatch):
    counted: list[str] = []
    monkeypatch.setattr(
        request_router,
        "DECISIONS",
        SimpleNamespace(inc=lambda tags: counted.append(tags["decision"])),
    )
    return counted


def test_a_longer_conversation_shares_the_hashes_of_its_first_turn():
    first = Routing(*chat("hello").args)
    longer = Routing(*chat("hello", "and more " * 100).args)
    other = Routing(*chat("hi").args)  # the same system prompt
    assert first.first_blocks > 2 and len(longer.hashes) > len(first.hashes)
    # The first turn's blocks, its last one partial, start every later turn; then the
    # shorter one's closing bracket.
    assert longer.hashes[: first.first_blocks] == first.hashes[: first.first_blocks]
    assert longer.hashes[first.first_blocks] != first.hashes[first.first_blocks]
    # Another conversation with the same system prompt parts at its first message's block.
    assert other.hashes[: first.first_blocks - 1] == first.hashes[: first.first_blocks - 1]
    assert other.hashes[first.first_blocks - 1] != first.hashes[first.first_blocks - 1]
    # A block ends at the head's end: here a byte, a whole block, the rest.
    assert len(block_hashes(b"x" * 300, 1)) == 3 and len(block_hashes(b"x" * 300, 300)) == 2


def test_every_api_hashes_what_its_engine_renders_first():
    assert prompt_text("completion", {"prompt": "abc"}) == b'null"abc"'
    responses = prompt_text("responses", {"instructions": "be brief", "input": "hi"})
    assert responses.startswith(b'["be brief",null]')
    hi = [{"role": "user", "content": "hi"}]
    messages = prompt_text("messages", {"system": "be brief", "messages": hi})
    assert messages == b'["be brief",null][{"role":"user","content":"hi"}]'
    assert prompt_text("messages", {"messages": hi}) != prompt_text("messages", {"messages": []})


def test_the_index_finds_the_longest_prefix_and_forgets_tails_first():
    index = PrefixIndex()
    a, b = "a", "b"
    index.add(a, [1, 2, 3])
    index.add(b, [1, 2])
    assert index.longest([1, 2, 3, 4], {a, b}) == (3, {a})
    assert index.longest([1, 2, 9], {a, b}) == (2, {a, b})
    assert index.longest([1, 2, 3], {b}) == (2, {b})
    assert index.longest([7], {a, b}) == (0, set())
    index.size(a, cache_tokens=2 * BLOCK_BYTES // request_router.BYTES_PER_TOKEN)
    index.add(a, [1, 2, 3])  # over its cache: the tail goes, the head stays
    assert index.blocks(a) == 2
    assert index.longest([1, 2, 3], {a}) == (2, {a})
    index.drop(a)
    assert index.longest([1, 2, 3], {a, b}) == (2, {b})
    index.size("c", cache_tokens=1000)  # reported its cache, not sent anything yet
    assert index.engines() == {b, "c"}
    index.drop("c")
    assert index.engines() == {b}


def test_every_turn_of_a_conversation_starts_with_its_first_turn():
    first = chat("hello").args[1]
    later = chat("hello", "more").args[1]
    for api, body in (("chat", first), ("chat", later)):
        assert prompt_text(api, body).startswith(first_turn_text(api, body))
    assert first_turn_text("chat", first) == first_turn_text("chat", later)
    assert first_turn_text("chat", chat("hi").args[1]) != first_turn_text("chat", first)
    items = [{"type": "message", "role": "user", "content": "hi"}]
    turn = {"instructions": "x", "input": items}
    assert first_turn_text("responses", turn) == first_turn_text(
        "responses", {**turn, "input": [*items, {"type": "message", "role": "assistant"}]}
    )
    assert first_turn_text("completion", {"prompt": "p" * 1000}) == b'null"' + b"p" * 251


async def test_a_conversation_starts_on_its_home_and_returns_to_the_replica_that_holds_it(
    decisions,
):
    router = Router()
    replicas = [replica(name) for name in "abcd"]
    first = chat("hello", request_id="1")
    ranks = await router.choose_replicas(replicas, first)
    assert len(ranks[0]) == 1 and len(ranks[1]) == 2
    [home] = ranks[0]
    took = next(r for r in ranks[1] + replicas if r.replica_id != home.replica_id)
    router.routed(first, took)  # its home was full: the next rank took it
    second = chat("hello", "more", request_id="2")
    assert (await router.choose_replicas(replicas, second))[0] == [took]
    router.routed(second, took)
    assert decisions == ["spill", "affinity"]


async def test_an_adapters_requests_share_a_home_whatever_their_conversation(decisions):
    router = Router()
    replicas = [replica(name) for name in "abcdefgh"]

    def adapted(message: str, model: str) -> SimpleNamespace:
        request = chat(message, request_id=f"{model}{message}")
        request.args[1]["model"] = model
        return request

    homes = set()
    for message in ("hi", "yo", "hey", "hello", "morning"):
        [home] = (await router.choose_replicas(replicas, adapted(message, "T:acme")))[0]
        homes.add(home.replica_id)
    assert len(homes) == 1
    others = set()
    for adapter in ("T:a", "T:b", "T:c", "T:d", "T:e", "T:f"):
        [home] = (await router.choose_replicas(replicas, adapted("hi", adapter)))[0]
        others.add(home.replica_id)
    assert len(others) > 1  # adapters spread over the replicas
    # The same conversation on the base model or another adapter shares no cached prefix.
    base, acme = chat("hello").args, adapted("hello", "T:acme").args
    assert not set(Routing(*base).hashes) & set(Routing(*acme).hashes)


def test_embeddings_go_by_load_alone():
    router = Router()
    assert router._routing(pending(("embeddings", {"input": ["a"]}))) is None


async def test_a_shared_system_prompt_and_a_short_first_message_still_find_their_replica(
    decisions,
):
    """Every conversation here shares its system prompt; the first message that tells them
    apart ends inside a block: that block counts too."""
    router = Router()
    a, b = replica("a"), replica("b")
    for message, holder in (("hi", a), ("yo", b)):
        first = chat(message, request_id=message)
        await router.choose_replicas([a, b], first)
        router.routed(first, holder)
    later = chat("hi", "more", request_id="later")
    assert (await router.choose_replicas([a, b], later))[0] == [a]
    router.routed(later, a)
    assert decisions[-1] == "affinity"  # the first turns went where the test put them


async def test_requests_cancelled_before_they_were_routed_are_forgotten(decisions):
    router = Router()
    a = replica("a")
    cancelled = chat("hello", request_id="1")
    await router.choose_replicas([a], cancelled)
    cancelled.future.cancel()
    # Serve sets a request's future when it picks a replica, and says it was routed only once
    # the replica accepted it: meanwhile it routes others.
    picked = chat("hi", request_id="2")
    await router.choose_replicas([a], picked)
    picked.future.set_result(a)
    await router.choose_replicas([a], chat("hey", request_id="3"))
    assert list(router._pending) == ["2", "3"]
    router.routed(picked, a)
    assert router._index.blocks("a") == len(Routing(*picked.args).hashes)
    assert decisions == ["home"]


async def test_every_ingress_replica_sends_a_conversation_home_and_homes_spread():
    """Each ingress replica has its own router and index: a turn through another one finds
    the conversation on its home all the same."""
    replicas = [replica(name) for name in "abcd"]
    homes = set()
    for number in range(40):
        turns = [
            chat(f"conversation {number}", "x" * turn, request_id=f"{number}.{turn}")
            for turn in range(3)
        ]
        chosen = []
        for turn in turns:
            router = Router()  # a turn through an ingress replica that never saw it
            [home], _ = await router.choose_replicas(replicas, turn)
            chosen.append(home.replica_id)
        assert len(set(chosen)) == 1
        homes.add(chosen[0])
        # A replica that leaves moves only the conversations homed on it.
        rest = [r for r in replicas if r.replica_id != replicas[0].replica_id]
        [moved], _ = await Router().choose_replicas(rest, turns[0])
        assert moved.replica_id == chosen[0] or chosen[0] == replicas[0].replica_id
    assert len(homes) == 4


async def test_a_new_conversation_starts_on_its_second_rank_where_the_first_is_busier(decisions):
    """Hashing alone piles conversations unevenly; a first turn evens that out, a later turn
    that reaches an ingress replica that never saw it still goes to the first rank."""
    replicas = [replica(name) for name in "abcd"]
    first_turn = chat("hello", request_id="1")
    home, second, *_ = (
        next(r for r in replicas if r.replica_id.unique_id == engine)
        for engine in homes(Routing(*first_turn.args).home_key, "abcd")
    )
    router = Router()
    router.replica_queue_len_cache.update({r.replica_id: 1 for r in replicas})
    router.replica_queue_len_cache[home.replica_id] = NEW_HOME_SPREAD
    assert (await router.choose_replicas(replicas, first_turn))[0] == [home]
    router.replica_queue_len_cache[home.replica_id] = 1 + NEW_HOME_SPREAD
    assert (await router.choose_replicas(replicas, chat("hello", request_id="2")))[0] == [second]
    later = chat("hello", "more", request_id="3")
    assert (await router.choose_replicas(replicas, later))[0] == [home]
    assert (await Router().choose_replicas(replicas, later))[0] == [home]


async def test_a_busy_holder_spills_to_the_least_busy(decisions):
    router = Router(max_imbalance=4)
    a, b = replica("a"), replica("b")
    first = chat("hello", request_id="1")
    await router.choose_replicas([a, b], first)
    router.routed(first, a)  # home or not: a holds it now
    router.replica_queue_len_cache.update({a.replica_id: 5, b.replica_id: 1})
    second = chat("hello", "more " * 100, request_id="2")
    assert (await router.choose_replicas([a, b], second))[0] in ([a, b], [b, a])
    router.routed(second, b)
    router.replica_queue_len_cache.update({a.replica_id: 4, b.replica_id: 1})
    third = chat("hello", "more " * 100, "again", request_id="3")
    # b holds more of it; a, less busy than the bound now, holds only its head.
    assert (await router.choose_replicas([a, b], third))[0] == [b]
    router.routed(third, b)
    assert decisions == ["home", "spill", "affinity"]


async def test_a_full_holder_gives_way_to_the_next_rank_and_that_counts_as_a_spill(decisions):
    router = Router()
    a, b = replica("a"), replica("b")
    first = chat("hello", request_id="1")
    await router.choose_replicas([a, b], first)
    router.routed(first, a)
    second = chat("hello", "more", request_id="2")
    preferred, next_rank = await router.choose_replicas([a, b], second)
    assert preferred == [a] and sorted(r.replica_id.unique_id for r in next_rank) == ["a", "b"]
    router.routed(second, b)  # Serve found a full and took the next rank
    assert decisions == ["home", "spill"]


async def test_replicas_that_leave_take_their_entries_with_them():
    router = Router()
    a, b = replica("a"), replica("b")
    first = chat("hello", request_id="1")
    await router.choose_replicas([a, b], first)
    router.routed(first, a)
    router._index.drop("a")  # as update_replicas does for a replica gone
    second = chat("hello", request_id="2")
    ranks = await router.choose_replicas([b], second)
    assert ranks == [[b], [b]]  # b: its home now


async def test_other_calls_go_anywhere_and_feeds_to_the_replica_they_name():
    router = Router()
    a, b = replica("a"), replica("b")
    info = pending((), call_method="info")
    assert sorted(
        r.replica_id.unique_id for r in (await router.choose_replicas([a, b], info))[0]
    ) == ["a", "b"]
    feed = pending(("ingress",), call_method="feed", **{FEED_TARGET: "b"})
    assert await router.choose_replicas([a, b], feed) == [[b]]
    gone = pending(("ingress",), call_method="feed", **{FEED_TARGET: "c"})
    assert await router.choose_replicas([a, b], gone) == []
    # Serve then asks again after a pause, not at once in a loop that never yields.
    assert gone.routing_context.should_backoff and info.routing_context.should_backoff


async def test_a_request_tried_again_passes_over_the_replicas_that_failed_it():
    router = Router()
    replicas = [replica(name) for name in "ab"]
    for failed, left in (("a", "b"), ("b", "a")):
        again = chat("hello", request_id=failed)
        again.kwargs[AVOID] = (failed,)
        ranks = await router.choose_replicas(replicas, again)
        assert {r.replica_id.unique_id for rank in ranks for r in rank} == {left}
    everyone = chat("hello", request_id="both")
    everyone.kwargs[AVOID] = ("a", "b")  # none other left: a replica that recovered beats none
    ranks = await router.choose_replicas(replicas, everyone)
    assert {r.replica_id.unique_id for rank in ranks for r in rank} <= {"a", "b"} and ranks[0]


async def test_a_gangs_replicas_share_its_engines_cache_home_and_load(decisions):
    """The replicas of a gang serve one engine: what one was sent, the other holds too."""
    router = Router(max_imbalance=4)
    gang = [replica("g0", gang="g"), replica("g1", gang="g")]
    other = [replica("h0", gang="h"), replica("h1", gang="h")]
    replicas = gang + other
    first = chat("hello", request_id="1")
    home = (await router.choose_replicas(replicas, first))[0]
    assert {r.replica_id.unique_id[0] for r in home} in ({"g"}, {"h"}) and len(home) == 2
    router.routed(first, gang[0])  # a spill if h was its home: g holds it now, either way
    later = chat("hello", "more", request_id="2")
    assert sorted((await router.choose_replicas(replicas, later))[0], key=id) == sorted(
        gang, key=id
    )
    router.routed(later, gang[1])  # the other member: the same engine, so the same cache
    assert decisions[-1] == "affinity"
    # The bound counts the engine's requests: 3 + 2 on g against 1 on h is 4 more.
    loads = {"g0": 3, "g1": 2, "h0": 1, "h1": 0}
    router.replica_queue_len_cache.update({ReplicaKey(name): n for name, n in loads.items()})
    busy = chat("hello", "more", "again", request_id="3")
    await router.choose_replicas(replicas, busy)
    router.routed(busy, other[1])
    assert decisions[-1] == "spill"


async def test_a_request_tried_again_passes_over_the_engine_that_failed_it():
    router = Router()
    replicas = [replica("g0", gang="g"), replica("g1", gang="g"), replica("h0", gang="h")]
    again = chat("hello", request_id="again")
    again.kwargs[AVOID] = ("g1",)
    ranks = await router.choose_replicas(replicas, again)
    assert {r.replica_id.unique_id for rank in ranks for r in rank} == {"h0"}
    # With no other engine left, the other replica of the same one.
    again.kwargs[AVOID] = ("g1", "h0")
    ranks = await router.choose_replicas(replicas, again)
    assert {r.replica_id.unique_id for rank in ranks for r in rank} == {"g0"}
