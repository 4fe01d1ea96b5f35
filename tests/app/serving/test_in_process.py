"""A type whose engine runs in the ingress (app.serving.in_process), on a fake engine: the
bound Serve's queue would set, a stream cut short that aborts the engine's request, and
failures answered as for a deployed type. The real engine: tests/e2e/test_in_ingress.py."""

import asyncio

import pytest

from app.limits.ticket import Meter
from app.openai.errors import ApiError
from app.serving.endpoints import ModelEndpoints
from app.serving.in_process import LocalEndpoint
from app.serving.migration import Attempts
from deployments.model_type import ModelTypeConfig
from deployments.wire import EngineFailed, InvalidGenerationRequest, ReplyPart


class FakeEngine:
    """Streams `tokens` parts, one per `step_s`; records the requests it aborted."""

    def __init__(self, tokens: int = 3, step_s: float = 0.0, fail: Exception | None = None):
        self.tokens = tokens
        self.step_s = step_s
        self.fail = fail
        self.aborted = 0
        self.dead = False

    async def serve(self, api: str, body: dict):
        try:
            if self.fail is not None:
                raise self.fail
            for n in range(1, self.tokens + 1):
                await asyncio.sleep(self.step_s)
                yield ReplyPart(b"data: x\n\n", 5, n, last=n == self.tokens)
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted += 1
            raise

    def errored(self) -> bool:
        return self.dead


def meter() -> Meter:
    return Meter(lambda prompt, completion: asyncio.get_running_loop().create_future())


def local(engine: FakeEngine, **fields) -> LocalEndpoint:
    config = ModelTypeConfig(name="ServiceAi-Fast", in_ingress=True, **fields)
    return LocalEndpoint(config, engine)


async def test_a_stream_is_its_first_part_then_the_rest_counted_on_the_meter():
    endpoint = local(FakeEngine(tokens=3))
    counted = meter()
    first, rest = await endpoint.open_stream("chat", {}, counted)
    parts = [first, await anext(rest), await anext(rest)]
    assert [p.completion_tokens for p in parts] == [1, 2, 3]
    assert counted.completion_tokens == 1  # the pipeline counts the rest as it relays them
    # The pipeline reads no further than the last part, and cancels nothing after it: the
    # request's place is free all the same (a leak here refused every request after 320).
    assert endpoint._held == 0


async def test_beyond_ongoing_and_queued_requests_the_type_is_overloaded_as_a_deployment_is():
    endpoint = local(
        FakeEngine(tokens=50, step_s=0.01), max_ongoing_requests=1, max_queued_requests=1
    )
    held = [await endpoint.open_stream("chat", {}, meter()) for _ in range(2)]
    with pytest.raises(ApiError) as refused:
        await endpoint.open_stream("chat", {}, meter())
    assert (refused.value.status, refused.value.code) == (503, "model_overloaded")
    assert refused.value.headers == {"Retry-After": "1"}
    held[0][1].cancel()  # the client left: its place is free at once
    await endpoint.open_stream("chat", {}, meter())


async def test_a_stream_cancelled_between_parts_aborts_the_engine_request():
    engine = FakeEngine(tokens=50, step_s=0.01)
    endpoint = local(engine)
    _, rest = await endpoint.open_stream("chat", {}, meter())
    await anext(rest)
    rest.cancel()
    await asyncio.sleep(0.05)
    assert engine.aborted == 1
    assert endpoint._held == 0


async def test_a_stream_whose_reader_is_cancelled_aborts_the_engine_request():
    engine = FakeEngine(tokens=50, step_s=0.05)
    endpoint = local(engine)
    _, rest = await endpoint.open_stream("chat", {}, meter())
    reader = asyncio.ensure_future(anext(rest))
    await asyncio.sleep(0.01)
    reader.cancel()  # the client left while the stream waited for its next token
    with pytest.raises(asyncio.CancelledError):
        await reader
    rest.cancel()
    assert engine.aborted == 1
    assert endpoint._held == 0


async def test_whole_replies_are_joined_and_refusals_keep_their_status():
    endpoint = local(FakeEngine(tokens=2))
    reply = await endpoint.reply("chat", {}, meter())
    assert reply.data == b"data: x\n\n" * 2 and reply.last
    refusal = InvalidGenerationRequest("too long")
    refusal.code = "context_length_exceeded"
    with pytest.raises(ApiError) as refused:
        await local(FakeEngine(fail=refusal)).reply("chat", {}, meter())
    assert (refused.value.status, refused.value.code) == (400, "context_length_exceeded")
    with pytest.raises(ApiError) as refused:
        await local(FakeEngine(fail=refusal)).open_stream("chat", {}, meter())
    assert refused.value.status == 400


async def test_a_dead_engine_makes_the_type_unavailable():
    engine = FakeEngine()
    endpoint = local(engine)
    endpoints = ModelEndpoints({"ServiceAi-Fast": endpoint}, created=0)
    assert endpoints.resolve("ServiceAi-Fast") is endpoint
    assert endpoints.readiness() == {"ServiceAi-Fast": "ready"}
    with pytest.raises(ApiError) as failed:
        await local(FakeEngine(fail=EngineFailed("engine died"))).open_stream("chat", {}, meter())
    assert (failed.value.status, failed.value.code) == (503, "model_unavailable")
    engine.dead = True
    with pytest.raises(ApiError) as unavailable:
        endpoints.resolve("ServiceAi-Fast")
    assert (unavailable.value.status, unavailable.value.code) == (503, "model_unavailable")
    assert endpoints.local() == [endpoint]


async def test_a_request_its_engine_failed_has_nowhere_else_to_go_on():
    endpoint = local(FakeEngine(fail=EngineFailed("dropped the request")))
    with pytest.raises(ApiError) as failed:
        await endpoint.open_stream("chat", {}, meter())
    assert (failed.value.status, failed.value.code) == (503, "model_unavailable")
    assert not Attempts(2).take(failed.value, endpoint)  # one engine, and it failed it
    assert not Attempts(2).take(endpoint.error(EOFError("cut short")), endpoint)
