"""The adapter's own logic around vLLM's serving layer: token counting and event batching.

The serving layer itself runs for real in tests/e2e; here a stand-in engine feeds known outputs.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from vllm.sampling_params import RequestOutputKind

from deployments import engine as engine_module
from deployments.engine import (
    CountingEngineClient,
    TokenCount,
    VllmEngine,
    _counting,
    _EventReader,
)
from deployments.generation import InvalidGenerationRequest

PARAMS = ("messages", "tools")


def output(prompt: int, *choices: tuple[int, int]):
    return SimpleNamespace(
        prompt_token_ids=list(range(prompt)),
        outputs=[SimpleNamespace(index=i, token_ids=list(range(n))) for i, n in choices],
    )


class StandInEngine:
    def __init__(self, outputs):
        self.outputs = outputs

    async def generate(self, prompt, sampling_params, request_id, **kwargs):
        for item in self.outputs:
            yield item


async def count(outputs, kind) -> TokenCount:
    tokens = TokenCount()
    _counting.set(tokens)
    client = CountingEngineClient(StandInEngine(outputs))
    async for _ in client.generate("p", SimpleNamespace(output_kind=kind), "r"):
        pass
    return tokens


async def test_delta_outputs_are_summed_per_choice():
    tokens = await count([output(7, (0, 1), (1, 1)), output(7, (0, 2), (1, 1))], RequestOutputKind.DELTA)
    assert (tokens.prompt, tokens.completion) == (7, 5)


async def test_cumulative_outputs_count_only_what_is_new():
    tokens = await count([output(4, (0, 2)), output(4, (0, 5))], RequestOutputKind.CUMULATIVE)
    assert (tokens.prompt, tokens.completion) == (4, 5)


async def test_several_engine_requests_add_to_one_count():
    tokens = TokenCount()
    _counting.set(tokens)
    client = CountingEngineClient(StandInEngine([output(3, (0, 2))]))
    for request_id in ("a", "b"):
        async for _ in client.generate("p", SimpleNamespace(output_kind=RequestOutputKind.DELTA), request_id):
            pass
    assert (tokens.prompt, tokens.completion) == (6, 4)


async def test_events_that_arrive_together_are_taken_together():
    arrived = asyncio.Event()

    async def events():
        yield "data: 1\n\n"
        yield "data: 2\n\n"
        arrived.set()
        yield "data: 3\n\n"

    reader = _EventReader(events(), PARAMS)
    await arrived.wait()
    await asyncio.sleep(0)
    batches = []
    while batch := await reader.take():
        batches.append(batch)
    await reader.close()
    assert sum(batches, []) == ["data: 1\n\n", "data: 2\n\n", "data: 3\n\n"]
    assert len(batches) < 3


async def test_a_backlog_is_taken_in_batches_of_at_most_a_part(monkeypatch):
    monkeypatch.setattr(engine_module, "MAX_PART_BYTES", 20)
    arrived = asyncio.Event()

    async def events():
        for i in range(6):
            yield f"data: {i}\n\n"  # 9 bytes each
        arrived.set()

    reader = _EventReader(events(), PARAMS)
    await arrived.wait()
    await asyncio.sleep(0)
    batches = []
    while batch := await reader.take():
        batches.append(batch)
    await reader.close()
    assert [len(b) for b in batches] == [3, 3]


async def test_a_failed_stream_event_becomes_the_envelope():
    async def events():
        yield 'data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}\n\n'
        yield "data: [DONE]\n\n"

    reader = _EventReader(events(), PARAMS)
    taken = []
    while batch := await reader.take():
        taken += batch
    assert '"code": "model_unavailable"' in taken[0] and "boom" not in taken[0]
    assert taken[-1] == "data: [DONE]\n\n"
    assert reader.ended == 503


async def test_a_refusal_in_the_first_event_is_raised_before_any_event():
    """vLLM refuses some requests only once their stream runs (a token id out of the
    vocabulary): the client still gets the 400 as an HTTP status."""

    async def events():
        yield ('data: {"error": {"message": "Token id 600 is out of vocabulary", '
               '"type": "BadRequestError", "param": null, "code": 400}}\n\n')
        yield "data: [DONE]\n\n"

    reader = _EventReader(events(), PARAMS)
    with pytest.raises(InvalidGenerationRequest, match="out of vocabulary") as refused:
        await reader.take()
    assert refused.value.status == 400
    await reader.close()


async def test_a_refusal_after_the_first_event_keeps_its_status_in_the_envelope():
    async def events():
        yield "data: 1\n\n"
        yield ('data: {"error": {"message": "bad stop", "type": "BadRequestError", '
               '"param": "stop", "code": 400}}\n\n')
        yield "data: [DONE]\n\n"

    reader = _EventReader(events(), PARAMS)
    taken = []
    while batch := await reader.take():
        taken += batch
    error = json.loads(taken[1].removeprefix("data: "))["error"]
    assert error == {"message": "bad stop", "type": "invalid_request_error", "param": "stop",
                     "code": "invalid_value"}
    assert reader.ended == 400


async def test_closing_the_reader_closes_the_serving_layers_generator():
    closed = asyncio.Event()

    async def endless():
        try:
            while True:
                yield "data: x\n\n"
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    reader = _EventReader(endless(), PARAMS)
    assert await reader.take()
    await reader.close()
    assert closed.is_set()


async def test_a_stream_that_raises_ends_with_the_envelope_and_done():
    async def events():
        yield "data: 1\n\n"
        raise RuntimeError("engine gone")

    reader = _EventReader(events(), PARAMS)
    taken = []
    while batch := await reader.take():
        taken += batch
    assert taken[0] == "data: 1\n\n"
    assert '"model_unavailable"' in taken[-1] and taken[-1].endswith("data: [DONE]\n\n")
    assert reader.ended == 503


async def test_the_batch_with_the_last_event_is_marked_as_the_end():
    async def events():
        yield "data: 1\n\n"
        await asyncio.sleep(0)
        yield "data: 2\n\n"
        yield "data: [DONE]\n\n"

    reader = _EventReader(events(), PARAMS)
    marks = []
    while batch := await reader.take():
        marks.append((batch[-1], reader.ended))
    assert marks[0] == ("data: 1\n\n", None)
    assert marks[-1] == ("data: [DONE]\n\n", 200)


async def whole_reply_parts(create, monkeypatch, limit: int | None = None) -> list:
    """The parts `_reply` yields for a whole reply whose serving-layer call is `create`."""
    monkeypatch.setattr(engine_module, "PROGRESS_S", 0.01)
    engine = object.__new__(VllmEngine)  # _reply needs no engine: create stands for it
    parts = []
    replies = engine._reply(create, None, ("messages", "tools"), True, True)
    async for part in replies:
        parts.append(part)
        if len(parts) == limit:
            await replies.aclose()
            break
    return parts


async def test_a_whole_reply_sends_its_counts_while_the_engine_works(monkeypatch):
    async def create(_):
        tokens = _counting.get()
        tokens.prompt = 7
        for _ in range(5):
            tokens.completion += 10
            await asyncio.sleep(0.01)
        return SimpleNamespace(model_dump_json=lambda: '{"id": "x"}')

    parts = await whole_reply_parts(create, monkeypatch)
    assert parts[-1] == (b'{"id": "x"}', 7, 50, 200, None, False)
    progress = parts[:-1]
    assert progress and all(p.data == b"" and p.prompt_tokens == 7 for p in progress)
    assert [p.completion_tokens for p in progress] == sorted(p.completion_tokens for p in progress)


async def test_a_whole_body_larger_than_a_ray_message_goes_in_parts(monkeypatch):
    monkeypatch.setattr(engine_module, "MAX_PART_BYTES", 4)

    async def create(_):
        _counting.get().prompt = 3
        return SimpleNamespace(model_dump_json=lambda: '{"id": "x"}')

    parts = await whole_reply_parts(create, monkeypatch)
    assert b"".join(p.data for p in parts) == b'{"id": "x"}'
    assert [p.ended for p in parts] == [None, None, 200]


async def test_a_whole_reply_closed_by_its_caller_cancels_the_serving_layers_call(monkeypatch):
    cancelled = asyncio.Event()

    async def create(_):
        _counting.get().prompt = 7
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    parts = await whole_reply_parts(create, monkeypatch, limit=1)
    assert parts == [(b"", 7, 0, None, None, False)]
    await asyncio.wait_for(cancelled.wait(), timeout=1)


async def test_a_whole_reply_is_counted_as_the_engine_goes_and_served_whole_at_the_end():
    """FINAL_ONLY would say nothing until the end: the engine is asked for cumulative outputs,
    counted as they come, and the serving layer gets one output with every choice (n = 2:
    each child's outputs come alone, as vLLM sends cumulative outputs of a parallel request)."""
    tokens = TokenCount()
    _counting.set(tokens)
    params = SimpleNamespace(output_kind=RequestOutputKind.FINAL_ONLY)
    client = CountingEngineClient(StandInEngine(
        [output(5, (0, 1)), output(5, (1, 2)), output(5, (0, 3)), output(5, (1, 4))]))
    served = []
    async for item in client.generate("p", params, "r"):
        served.append(item)
    assert params.output_kind == RequestOutputKind.CUMULATIVE
    assert (tokens.prompt, tokens.completion) == (5, 7)
    assert len(served) == 1
    assert [(c.index, len(c.token_ids)) for c in served[0].outputs] == [(0, 3), (1, 4)]
