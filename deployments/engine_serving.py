"""What a process holding an engine client serves: streams, feeds and whole replies.

The model replica (deployments.model_server) serves this way, each replica of a gang over one
engine (deployments.serving_processes) as a lone one does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from deployments.feed_hub import FeedHub, FeedItem
from deployments.wire import Api, EngineFailed, GenerationError, ReplyPart


class EngineServing:
    """Requests on one engine client (`engine`: a `VllmEngine`); `replica` names the replica
    on a stream's first part where the ingress could open a feed to it (None in a serving
    process: its replica names itself)."""

    def __init__(self, engine: Any, feeds: FeedHub, replica: str | None) -> None:
        self.engine = engine
        self.feeds = feeds
        self._replica = replica

    async def stream(
        self, api: Api, body: dict, ingress: str | None = None, key: int = 0
    ) -> AsyncIterator[ReplyPart]:
        """A streamed request of `api` from ingress replica `ingress` (its request `key`):
        batches of SSE events, or, while that ingress has a feed open here, the first part
        alone and the rest on the feed (its failure too, in order)."""
        feed = self.feeds.of(ingress)
        if feed is None:
            parts = self.engine.serve(api, body)
            try:
                first = await anext(parts)
                yield first._replace(replica=self._replica) if self.feeds.accepts else first
                async for part in parts:
                    yield part
            except GenerationError as error:
                raise self._failed(error) from None
            return
        feed.members.add(key)  # from here on the feed stays open, however long the prefill
        parts = self.engine.serve(api, body, batched=False)
        try:
            first = await anext(parts)
            if first.last:
                yield first
                return
            yield first._replace(replica=self._replica, via_feed=True)
            try:
                async for part in parts:
                    feed.put(key, part)
            except GenerationError as error:
                feed.put(key, self._failed(error))
        except GenerationError as error:
            raise self._failed(error) from None
        finally:
            feed.members.discard(key)
            await parts.aclose()

    async def feed(self, ingress: str) -> AsyncIterator[list[FeedItem]]:
        """The feed of ingress replica `ingress`."""
        async for batch in self.feeds.serve(ingress):
            yield batch

    async def reply(self, api: Api, body: dict) -> AsyncIterator[ReplyPart]:
        """A whole request of `api`: the token counts so far every second or so while the
        engine works (parts without data), then the JSON body, in parts up to its `last`."""
        try:
            async for part in self.engine.serve(api, body):
                yield part
                if part.last:
                    return
        except GenerationError as error:
            raise self._failed(error) from None
        raise self._failed(EngineFailed("The model engine ended the request without a reply."))

    def _failed(self, error: GenerationError) -> GenerationError:
        """`error`, naming this replica (or serving process) where it names none: the
        ingress passes it over when it tries the request again (app.serving.migration)."""
        error.replica = error.replica or self._replica
        return error
