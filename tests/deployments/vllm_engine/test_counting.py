"""The engine's token counts per API request, as the serving layer's engine requests pass.

The serving layer itself runs for real in tests/e2e; here a stand-in engine feeds known outputs.
"""

from __future__ import annotations

from types import SimpleNamespace

from vllm.sampling_params import RequestOutputKind

from deployments.vllm_engine.counting import CountingEngineClient, EngineTokens, count_this_request


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


async def count(outputs, kind) -> EngineTokens:
    tokens = count_this_request()
    client = CountingEngineClient(StandInEngine(outputs))
    async for _ in client.generate("p", SimpleNamespace(output_kind=kind), "r"):
        pass
    return tokens


async def test_delta_outputs_are_summed_per_choice():
    tokens = await count(
        [output(7, (0, 1), (1, 1)), output(7, (0, 2), (1, 1))], RequestOutputKind.DELTA
    )
    assert (tokens.prompt, tokens.completion) == (7, 5)


async def test_cumulative_outputs_count_only_what_is_new():
    tokens = await count([output(4, (0, 2)), output(4, (0, 5))], RequestOutputKind.CUMULATIVE)
    assert (tokens.prompt, tokens.completion) == (4, 5)


async def test_several_engine_requests_add_to_one_count():
    tokens = count_this_request()
    client = CountingEngineClient(StandInEngine([output(3, (0, 2))]))
    for request_id in ("a", "b"):
        async for _ in client.generate(
            "p", SimpleNamespace(output_kind=RequestOutputKind.DELTA), request_id
        ):
            pass
    assert (tokens.prompt, tokens.completion) == (6, 4)


async def test_a_whole_reply_is_counted_as_the_engine_goes_and_served_whole_at_the_end():
    """FINAL_ONLY would say nothing until the end: the engine is asked for cumulative outputs,
    counted as they come, and the serving layer gets one output with every choice (n = 2:
    each child's outputs come alone, as vLLM sends cumulative outputs of a parallel request)."""
    tokens = count_this_request()
    params = SimpleNamespace(output_kind=RequestOutputKind.FINAL_ONLY)
    client = CountingEngineClient(
        StandInEngine([output(5, (0, 1)), output(5, (1, 2)), output(5, (0, 3)), output(5, (1, 4))])
    )
    served = []
    async for item in client.generate("p", params, "r"):
        served.append(item)
    assert params.output_kind == RequestOutputKind.CUMULATIVE
    assert (tokens.prompt, tokens.completion) == (5, 7)
    assert len(served) == 1
    assert [(c.index, len(c.token_ids)) for c in served[0].outputs] == [(0, 3), (1, 4)]


async def test_streams_take_the_tokens_per_chunk_their_priority_gets():
    """Every API's engine requests pass here: a stream's chunk size is set from its priority;
    a whole reply, which is one chunk anyway, is left alone."""
    client = CountingEngineClient(
        StandInEngine([output(1, (0, 1))]), stream_interval=lambda priority: 8 if priority else 1
    )
    for priority, kind, expected in (
        (10, RequestOutputKind.DELTA, 8),
        (0, RequestOutputKind.DELTA, None),
        (10, RequestOutputKind.FINAL_ONLY, None),
    ):
        params = SimpleNamespace(output_kind=kind, stream_interval=None)
        async for _ in client.generate("p", params, "r", priority=priority):
            pass
        assert params.stream_interval == expected
