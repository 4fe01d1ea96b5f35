"""The ingress's end of stream feeds: inboxes filled from a feed, and every way one ends."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from ray.exceptions import RayActorError

from app.serving import stream_feeds as app_feeds
from app.serving.stream_feeds import INGRESS_ID, FeedLost, Feeds
from deployments.feed_hub import FeedItem
from deployments.wire import ReplyPart


class Call:
    """A Serve streaming call as the ingress holds it: parts fed in by the test."""

    def __init__(self) -> None:
        self.items: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.items.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True
        self.items.put_nowait(StopAsyncIteration())


class Handle:
    """The streaming handle: `feed.remote` opens the feed call the test drives."""

    def __init__(self) -> None:
        self.feeds: list[tuple[tuple, dict, Call]] = []
        self.feed = SimpleNamespace(remote=self._open)

    def _open(self, *args, **kwargs) -> Call:
        call = Call()
        self.feeds.append((args, kwargs, call))
        return call


def first(replica: str | None = "r1", via_feed: bool = False, last: bool = False) -> ReplyPart:
    return ReplyPart(b"data: first\n\n", 5, 1, last, replica=replica, via_feed=via_feed)


def token(n: int, last: bool = False) -> ReplyPart:
    return ReplyPart(b"data: t%d\n\n" % n, 5, n, last)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def open_feed(feeds: Feeds, handle: Handle) -> Call:
    """Open streams on replica r1 until the feed is asked for; the feed then opens."""
    for _ in range(2):
        feeds.opened(feeds.next_key(), Call(), first())
    await settle()
    ((args, kwargs, call),) = handle.feeds
    assert args == (INGRESS_ID,) and kwargs == {"feed_for": "r1"}
    call.items.put_nowait([])
    await settle()
    return call


async def test_a_feed_opens_once_enough_streams_run_on_one_replica_and_fills_their_inboxes():
    handle = Handle()
    feeds = Feeds(handle, min_streams=2)
    feeds.opened(feeds.next_key(), Call(), first(replica="r2"))
    feeds.opened(feeds.next_key(), Call(), first())
    await settle()
    assert handle.feeds == []  # one stream on each replica: no feed yet
    feed = await open_feed(feeds, handle)
    key = feeds.next_key()
    parts = feeds.opened(key, Call(), first(via_feed=True))
    feed.items.put_nowait([FeedItem(key, token(1)), FeedItem(999, token(9))])
    feed.items.put_nowait([FeedItem(key, token(2, last=True))])
    assert (await anext(parts)).data == b"data: t1\n\n"
    assert (await anext(parts)).last
    assert key not in feeds._inboxes  # released once ended


async def test_a_stream_on_a_feed_fails_when_its_replica_dies():
    handle = Handle()
    feeds = Feeds(handle, min_streams=2)
    await open_feed(feeds, handle)
    own = Call()
    parts = feeds.opened(feeds.next_key(), own, first(via_feed=True))
    own.items.put_nowait(RayActorError())  # the request's own call fails with its replica
    with pytest.raises(RayActorError):
        await anext(parts)


async def test_streams_on_a_feed_that_breaks_get_its_error():
    handle = Handle()
    feeds = Feeds(handle, min_streams=2)
    feed = await open_feed(feeds, handle)
    parts = feeds.opened(feeds.next_key(), Call(), first(via_feed=True))
    feed.items.put_nowait(RayActorError())
    with pytest.raises(RayActorError):
        await anext(parts)
    assert "r1" not in feeds._open


async def test_a_stream_sent_to_a_feed_this_ingress_no_longer_reads_fails_at_once():
    feeds = Feeds(Handle(), min_streams=100)
    parts = feeds.opened(feeds.next_key(), Call(), first(via_feed=True))
    with pytest.raises(FeedLost):
        await anext(parts)


async def test_a_feed_that_does_not_open_is_given_up(monkeypatch):
    monkeypatch.setattr(app_feeds, "FEED_OPEN_TIMEOUT_S", 0.05)
    handle = Handle()
    feeds = Feeds(handle, min_streams=1)
    feeds.opened(feeds.next_key(), Call(), first())
    await settle()
    ((_, _, call),) = handle.feeds
    for _ in range(500):  # the timeout is 0.05 s; a busy machine may take longer to run it
        if call.cancelled:
            break
        await asyncio.sleep(0.01)
    assert call.cancelled and "r1" not in feeds._open


async def test_cancelling_a_stream_on_a_feed_cancels_its_own_call_and_releases_it():
    handle = Handle()
    feeds = Feeds(handle, min_streams=2)
    await open_feed(feeds, handle)
    own = Call()
    key = feeds.next_key()
    parts = feeds.opened(key, own, first(via_feed=True))
    parts.cancel()
    assert own.cancelled and key not in feeds._inboxes
    await settle()
    assert feeds._streams_on["r1"] == 2  # the two streams that opened the feed


async def test_a_stream_on_its_own_call_reads_that_call():
    feeds = Feeds(Handle(), min_streams=4)
    own = Call()
    parts = feeds.opened(feeds.next_key(), own, first())
    own.items.put_nowait(token(1, last=True))
    assert (await anext(parts)).last
    assert "r1" not in feeds._streams_on


async def test_parts_that_come_on_the_feed_before_the_streams_first_part_wait_for_it():
    """The feed's message and the stream's own first part travel apart: the feed's may come
    first. Its parts wait in the stream's inbox (they were dropped: a reply lost its `{`)."""
    handle = Handle()
    feeds = Feeds(handle, min_streams=2)
    feed = await open_feed(feeds, handle)
    key = feeds.next_key()
    feed.items.put_nowait([FeedItem(key, token(2)), FeedItem(key, token(3, last=True))])
    await settle()  # the feed's batch is read before the stream's first part is
    parts = feeds.opened(key, Call(), first(via_feed=True))
    read = [await asyncio.wait_for(anext(parts), 5) for _ in range(2)]
    assert read == [token(2), token(3, last=True)]
    assert key not in feeds._inboxes  # released with its last part


async def test_a_stream_that_fails_before_its_first_part_leaves_no_inbox():
    feeds = Feeds(Handle(), min_streams=2)
    key = feeds.next_key()
    feeds.forget(key)
    assert key not in feeds._inboxes
