"""Stream feeds: one Ray message per engine step per ingress replica, not one per request.

Every streamed request is still its own Serve call, routed by Serve, counted as an ongoing
request, subject to the queue limit, cancelled when its client leaves and failed when its
replica dies. What changes is where its events travel after the first part: once an ingress
replica has a *feed* open to a model replica (a long-lived Serve call pinned to that replica
by the request router, deployments.request_router), that replica puts the events of all that ingress's requests on the feed,
and sends what one engine step produced for all of them as one message. The per-message cost
of Serve's streaming (serialisation, gRPC, the handle's wrappers, on both sides) is then paid
once per step instead of once per request per step.

A feed is an optimisation the ingress asks for when it has several streams on one replica;
a request that starts while none is open streams on its own call, as before, to its end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

from deployments.wire import EngineUnavailable, GenerationError, ReplyPart

FEED_IDLE_S = 2.0
"""A feed with no request for this long ends: a draining or idle replica must not be held."""
FEED_MIN_ONGOING = 32
"""Replicas that take fewer concurrent requests open no feeds: one would take a request's slot."""


class FeedItem(NamedTuple):
    """One request's part on a feed, or the failure that ended its stream: the ingress's key
    for the request, and the part."""

    key: int
    part: ReplyPart | GenerationError


class Feed:
    """The open feed of one ingress replica on this model replica."""

    def __init__(self) -> None:
        self.members: set[int] = set()
        self.closed = False
        self._pending: list[FeedItem] = []
        self._ready = asyncio.Event()

    def put(self, key: int, part: ReplyPart | GenerationError) -> None:
        if self.closed:
            raise EngineUnavailable("The stream's feed to the gateway closed. Retry shortly.")
        self._pending.append(FeedItem(key, part))
        self._ready.set()

    async def batches(self) -> AsyncIterator[list[FeedItem]]:
        """What arrived since the last batch, once per engine step; ends once idle."""
        yield []  # the feed is open: the ingress stops waiting for it
        while True:
            if not self._pending:
                try:
                    await asyncio.wait_for(self._ready.wait(), FEED_IDLE_S)
                except TimeoutError:
                    if not self.members:
                        return
                    continue
            # The engine's output handler wakes every request of a step before this task
            # runs; one more turn of the loop lets the last of them add their events.
            await asyncio.sleep(0)
            batch, self._pending = self._pending, []
            self._ready.clear()
            yield batch


class FeedHub:
    """The feeds open on this replica (or serving process), one per ingress replica."""

    def __init__(self, max_ongoing_requests: int) -> None:
        self.accepts = max_ongoing_requests >= FEED_MIN_ONGOING
        self._feeds: dict[str, Feed] = {}

    def of(self, ingress: str | None) -> Feed | None:
        return None if ingress is None else self._feeds.get(ingress)

    async def serve(self, ingress: str) -> AsyncIterator[list[FeedItem]]:
        feed = Feed()
        self._feeds[ingress] = feed  # a newer feed of the same ingress takes new requests
        try:
            async for batch in feed.batches():
                yield batch
        finally:
            feed.closed = True
            if self._feeds.get(ingress) is feed:
                del self._feeds[ingress]
