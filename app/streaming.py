"""Reading a model's stream at the pace its events are written to the client.

Every streamed message costs the ingress a gRPC read, an SSE event and a socket write, while
the engine produces one token per request per step. A reader task takes chunks off the handle
stream as they arrive; each time the writer is ready it takes everything that arrived
meanwhile, merged into one delta per choice. Nothing waits: when the writer keeps up, each
event is one chunk, as it arrived; only when it falls behind do events carry several tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ray.serve.handle import DeploymentResponseGenerator

from deployments.generation import Delta, GenerationChunk


async def coalesced(
    first: GenerationChunk, stream: DeploymentResponseGenerator
) -> AsyncIterator[tuple[Delta, ...]]:
    """The deltas of `first`, then of each batch of chunks that arrived while the last was written.

    Raises the stream's error after yielding what arrived before it.
    """
    yield first.deltas
    reader = _Reader(stream)
    try:
        while chunks := await reader.take():
            yield merge(chunks)
    finally:
        reader.close()


def merge(chunks: list[GenerationChunk]) -> tuple[Delta, ...]:
    """One delta per choice: texts joined, token counts added, the last finish reason kept."""
    if len(chunks) == 1:
        return chunks[0].deltas
    merged: dict[int, Delta] = {}
    for chunk in chunks:
        for delta in chunk.deltas:
            before = merged.get(delta.index)
            merged[delta.index] = delta if before is None else Delta(
                delta.index,
                before.text + delta.text,
                before.token_count + delta.token_count,
                delta.finish_reason or before.finish_reason,
            )
    return tuple(merged.values())


class _Reader:
    """Drains a handle stream into a buffer from its own task."""

    def __init__(self, stream: DeploymentResponseGenerator) -> None:
        self._stream = stream
        self._buffer: list[GenerationChunk] = []
        self._arrived = asyncio.Event()
        self._ended = False
        self._error: BaseException | None = None
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for chunk in self._stream:
                self._buffer.append(chunk)
                self._arrived.set()
        except Exception as exc:
            self._error = exc
        finally:
            self._ended = True
            self._arrived.set()

    async def take(self) -> list[GenerationChunk]:
        """Everything buffered, waiting for the first chunk if none is; [] once the stream ended."""
        await self._arrived.wait()
        chunks, self._buffer = self._buffer, []
        if not self._ended:
            self._arrived.clear()
        if not chunks and self._error is not None:
            raise self._error
        return chunks

    def close(self) -> None:
        self._task.cancel()
