"""The ingress's end of stream feeds (deployments.feed_hub).

Each request's stream is its own Serve call. Once this ingress replica runs several streams
on one model replica, it opens a feed there: a long-lived call on which that replica sends,
once per engine step, the events of every request of this ingress it serves. A request
whose first part says `via_feed` reads the rest from its inbox here, filled by the feed's
reader; its own call stays open, silent, so that Serve still counts it, cancels it when the
client leaves, and fails it when the replica dies.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections import Counter, deque

from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from deployments.feed_hub import FeedItem
from deployments.wire import ReplyPart

logger = logging.getLogger("ray.serve.serviceai")

INGRESS_ID = uuid.uuid4().hex
"""This ingress replica, as model replicas know its feed."""
FEED_OPEN_TIMEOUT_S = 5.0
"""A feed that is not open by then (its replica gone or full) is given up."""


class FeedLost(Exception):
    """The feed that carried a stream ended before the stream did."""


class Inbox:
    """The parts of one request that arrive on a feed, or the error that ended it."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[ReplyPart | BaseException] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: ReplyPart | BaseException) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> ReplyPart:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item


class StreamParts:
    """The parts of a stream after its first, from its own call or from the feed; `cancel`
    frees the engine (as the handle's own `cancel` does)."""

    def __init__(
        self, feeds: Feeds, key: int, call: DeploymentResponseGenerator, first: ReplyPart
    ) -> None:
        self._feeds = feeds
        self._key = key
        self._call = call
        self._replica = first.replica
        self._inbox: Inbox | None = None
        self._watch: asyncio.Task[None] | None = None
        self._released = False
        if first.via_feed:
            self._inbox = feeds.inbox(key, first.replica)
            self._watch = asyncio.ensure_future(self._watch_call())
        if first.last:
            self._release()

    def __aiter__(self) -> StreamParts:
        return self

    async def __anext__(self) -> ReplyPart:
        try:
            part = await (self._call.__anext__() if self._inbox is None else self._inbox.get())
        except BaseException:
            self._release()
            raise
        if part.last:
            self._release()
        return part

    def cancel(self) -> None:
        self._call.cancel()
        if self._watch is not None:
            self._watch.cancel()
        self._release()

    async def _watch_call(self) -> None:
        """The request's own call carries nothing more; it ends with the request, or raises
        if the replica dies or refuses to go on (its feed closed)."""
        try:
            async for _ in self._call:
                pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._inbox.put(exc)

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._feeds.release(self._key, self._replica)


class Feeds:
    """This ingress's feeds from the replicas of one model type, and the inboxes they fill."""

    def __init__(self, streaming: DeploymentHandle, min_streams: int) -> None:
        self._streaming = streaming
        self._min_streams = min_streams
        self._keys = itertools.count(1)
        self._inboxes: dict[int, Inbox] = {}
        self._streams_on: Counter[str] = Counter()
        self._open: dict[str, asyncio.Task[None]] = {}
        self._members: dict[str, set[int]] = {}

    def enabled(self) -> bool:
        return self._min_streams > 0

    def next_key(self) -> int:
        """A key for a stream about to be sent, with its inbox: the replica puts the parts
        after the first on the feed as soon as it has sent the first on the stream's own call,
        and the feed's message can arrive here before the call's (they travel apart): those
        parts wait in the inbox until the stream reads it. It was looked up when they arrived,
        and a stream whose first part was slower lost them (a reply with its opening `{`
        missing)."""
        key = next(self._keys)
        self._inboxes[key] = Inbox()
        return key

    def forget(self, key: int) -> None:
        """A stream that failed before its first part: its inbox goes."""
        self._inboxes.pop(key, None)

    def opened(self, key: int, call: DeploymentResponseGenerator, first: ReplyPart) -> StreamParts:
        """A stream whose first part arrived: its other parts, and a feed to its replica once
        this ingress runs enough streams there."""
        replica = first.replica
        if replica is not None:
            self._streams_on[replica] += 1
            enough = self._streams_on[replica] >= self._min_streams
            if replica not in self._open and enough and not first.last:
                self._open[replica] = asyncio.ensure_future(self._read(replica))
        return StreamParts(self, key, call, first)

    def inbox(self, key: int, replica: str | None) -> Inbox:
        inbox = self._inboxes.setdefault(key, Inbox())
        if replica is None or replica not in self._open:
            # The replica has a feed of ours that this ingress no longer reads (it ended
            # here first): the stream cannot be delivered.
            inbox.put(FeedLost("the feed of this stream is closed"))
        else:
            self._members.setdefault(replica, set()).add(key)
        return inbox

    def release(self, key: int, replica: str | None) -> None:
        self._inboxes.pop(key, None)
        if replica is not None:
            members = self._members.get(replica)
            if members is not None:
                members.discard(key)
            self._streams_on[replica] -= 1
            if self._streams_on[replica] <= 0:
                del self._streams_on[replica]

    async def _read(self, replica: str) -> None:
        call = FeedCall(self._streaming, replica)
        lost: BaseException = FeedLost("the feed of this stream ended before the stream")
        try:
            await asyncio.wait_for(call.open(), FEED_OPEN_TIMEOUT_S)
            inboxes = self._inboxes
            async for batch in call:
                for key, part in batch:
                    inbox = inboxes.get(key)
                    if inbox is not None:
                        inbox.put(part)
        except asyncio.CancelledError:
            call.cancel()
            raise
        except TimeoutError:
            call.cancel()
            logger.warning("No feed from replica %s within %.0f s", replica, FEED_OPEN_TIMEOUT_S)
        except Exception as exc:
            lost = exc
        finally:
            del self._open[replica]
            # Streams of this feed that had not ended: the replica closes a feed only once
            # its streams are done, so these lost it to a failure.
            for key in self._members.pop(replica, ()):
                inbox = self._inboxes.get(key)
                if inbox is not None:
                    inbox.put(lost)


class FeedCall:
    """The long-lived call that carries a feed: a Serve call pinned to a model replica."""

    def __init__(self, streaming: DeploymentHandle, replica: str) -> None:
        self._streaming = streaming
        self._replica = replica
        self._call: DeploymentResponseGenerator | None = None

    async def open(self) -> None:
        """Start the call and wait for its opening (empty) batch."""
        self._call = self._streaming.feed.remote(INGRESS_ID, feed_for=self._replica)
        await self._call.__anext__()

    def __aiter__(self) -> FeedCall:
        return self

    async def __anext__(self) -> list[FeedItem]:
        assert self._call is not None
        return await self._call.__anext__()

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()
