"""The model replica's end of stream feeds: one batch per engine step, closed once idle."""

from __future__ import annotations

import asyncio

import pytest

from deployments import feed_hub as feeds
from deployments.feed_hub import Feed, FeedHub, FeedItem
from deployments.wire import EngineUnavailable, ReplyPart


def part(text: str, last: bool = False) -> ReplyPart:
    return ReplyPart(text.encode(), 3, 1, last)


async def test_what_requests_put_in_one_step_is_one_batch():
    feed = Feed()
    batches = feed.batches()
    assert await anext(batches) == []  # the opening message
    feed.members.update({1, 2})
    waiting = asyncio.ensure_future(anext(batches))
    await asyncio.sleep(0)

    async def request(key: int) -> None:  # as each request's task runs in one engine step
        feed.put(key, part(f"k{key}"))

    await asyncio.gather(request(1), request(2))
    assert await waiting == [FeedItem(1, part("k1")), FeedItem(2, part("k2"))]
    feed.put(2, part("k2'", last=True))
    assert await anext(batches) == [FeedItem(2, part("k2'", last=True))]


async def test_a_feed_ends_once_idle_and_never_while_a_request_is_on_it(monkeypatch):
    monkeypatch.setattr(feeds, "FEED_IDLE_S", 0.05)
    hub = FeedHub(max_ongoing_requests=64)
    served = hub.serve("ingress-a")
    assert await anext(served) == []
    feed = hub.of("ingress-a")
    feed.members.add(7)  # a long prefill: nothing to send for a while
    following = asyncio.ensure_future(anext(served))
    await asyncio.sleep(0.2)
    assert not following.done()
    feed.members.discard(7)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(following, 1)
    assert hub.of("ingress-a") is None and feed.closed


async def test_a_request_on_a_closed_feed_fails_as_unavailable():
    hub = FeedHub(max_ongoing_requests=64)
    served = hub.serve("ingress-a")
    await anext(served)
    feed = hub.of("ingress-a")
    await served.aclose()  # the ingress went away
    with pytest.raises(EngineUnavailable):
        feed.put(1, part("x"))


def test_small_replicas_open_no_feeds():
    """A feed takes one of the replica's request slots: not where there are few."""
    assert not FeedHub(max_ongoing_requests=1).accepts
    assert FeedHub(max_ongoing_requests=feeds.FEED_MIN_ONGOING).accepts
