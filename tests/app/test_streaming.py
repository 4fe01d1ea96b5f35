import asyncio

import pytest

from app.streaming import coalesced, merge
from deployments.generation import Delta, GenerationChunk


def chunk(*deltas: Delta) -> GenerationChunk:
    return GenerationChunk(prompt_tokens=5, deltas=deltas)


class Stream:
    """A handle stream whose chunks the test releases one by one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[GenerationChunk | BaseException | None] = asyncio.Queue()
        self.closed = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> GenerationChunk:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item


def test_merge_joins_text_and_adds_tokens_per_choice():
    merged = merge([
        chunk(Delta(0, "Hel", 1, None), Delta(1, "A", 1, None)),
        chunk(Delta(0, "lo", 1, None)),
        chunk(Delta(0, "!", 1, "stop"), Delta(1, "B", 2, "length")),
    ])
    assert merged == (Delta(0, "Hello!", 3, "stop"), Delta(1, "AB", 3, "length"))


def test_merge_of_one_chunk_is_that_chunk():
    only = chunk(Delta(0, "x", 1, None))
    assert merge([only]) is only.deltas


async def test_a_reader_that_keeps_up_gets_each_chunk_as_it_arrived():
    stream = Stream()
    events = coalesced(chunk(Delta(0, "a", 1, None)), stream)
    assert await anext(events) == (Delta(0, "a", 1, None),)
    for text in "bc":
        stream.queue.put_nowait(chunk(Delta(0, text, 1, None)))
        assert await anext(events) == (Delta(0, text, 1, None),)
    stream.queue.put_nowait(None)
    with pytest.raises(StopAsyncIteration):
        await anext(events)


async def test_a_reader_that_falls_behind_gets_what_arrived_meanwhile_in_one_event():
    stream = Stream()
    events = coalesced(chunk(Delta(0, "a", 1, None)), stream)
    await anext(events)
    for text in "bcd":
        stream.queue.put_nowait(chunk(Delta(0, text, 1, None)))
    stream.queue.put_nowait(chunk(Delta(0, "e", 1, "stop")))
    stream.queue.put_nowait(None)
    await asyncio.sleep(0.01)  # the writer is busy while the engine produces four chunks
    assert [d async for d in events] == [(Delta(0, "bcde", 4, "stop"),)]


async def test_an_error_comes_after_the_chunks_that_preceded_it():
    stream = Stream()
    events = coalesced(chunk(Delta(0, "a", 1, None)), stream)
    await anext(events)
    stream.queue.put_nowait(chunk(Delta(0, "b", 1, None)))
    stream.queue.put_nowait(RuntimeError("engine died"))
    await asyncio.sleep(0.01)
    assert await anext(events) == (Delta(0, "b", 1, None),)
    with pytest.raises(RuntimeError, match="engine died"):
        await anext(events)


async def test_closing_the_events_stops_the_reader_task():
    stream = Stream()
    events = coalesced(chunk(Delta(0, "a", 1, None)), stream)
    await anext(events)
    pending = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.01)
    pending.cancel()  # the client disconnected while the writer waited for the engine
    with pytest.raises(asyncio.CancelledError):
        await pending
    await events.aclose()
    await asyncio.sleep(0)
    readers = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "_Reader._read"]
    assert readers == []
