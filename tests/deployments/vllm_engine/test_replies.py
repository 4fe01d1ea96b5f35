"""One request through a served API: parts, counts, batches, refusals and failures.

vLLM's serving layer runs for real in tests/e2e; here a stand-in API plays it, so that what the
driver adds (the same for every API) is shown alone.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import GenerationError as VLLMGenerationError
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.exceptions import EngineDeadError

from deployments.vllm_engine import counting, replies
from deployments.vllm_engine.completions import ChatApi
from deployments.vllm_engine.replies import Event, EventBatcher, serve
from deployments.wire import EndedInEngine, EngineUnavailable, InvalidGenerationRequest


class Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    stream: bool = False


class StandInApi:
    """A served API whose serving layer is `create` and whose stream is `stream`'s events."""

    request_type = Body
    prompt_param = "messages"

    def __init__(self, create=None, stream=None) -> None:
        self._create = create
        self._stream = stream

    def create(self, request: Any):
        return self._create(request)

    def create_error_response(self, error: Exception) -> ErrorResponse:
        return error_response(str(error), 400)

    def body(self, result: Any, request: Any) -> bytes:
        return result

    def events(self, stream: Any, request: Any):
        return self._stream()

    def schema_param(self, body: dict) -> str:
        return "response_format"


def error_response(message: str, code: int, param: str | None = None) -> ErrorResponse:
    return ErrorResponse.model_validate(
        {"error": {"message": message, "type": "BadRequestError", "param": param, "code": code}}
    )


async def parts_of(
    api, body: dict, limit: int | None = None, batched: bool = True, grammar: str | None = None
) -> list:
    parts = []
    served = serve(api, body, batched=batched, grammar=grammar)
    async for part in served:
        parts.append(part)
        if len(parts) == limit:
            break
    await served.aclose()
    return parts


def streamed(*events: Event, then: Exception | None = None):
    async def create(_):
        counting._counted.get().prompt = 7
        return "stream"

    async def stream():
        for event in events:
            await asyncio.sleep(0)
            yield event
        if then is not None:
            raise then

    return StandInApi(create, stream)


@pytest.fixture(autouse=True)
def quick_progress(monkeypatch):
    monkeypatch.setattr(counting, "PROGRESS_S", 0.01)


async def test_a_whole_reply_sends_its_counts_while_the_engine_works():
    async def create(_):
        tokens = counting._counted.get()
        tokens.prompt = 7
        for _ in range(5):
            tokens.completion += 10
            await asyncio.sleep(0.01)
        return b'{"id": "x"}'

    parts = await parts_of(StandInApi(create), {})
    assert parts[-1] == (b'{"id": "x"}', 7, 50, True, None, None, False)
    progress = parts[:-1]
    assert progress and all(p.data == b"" and p.prompt_tokens == 7 for p in progress)
    assert [p.completion_tokens for p in progress] == sorted(p.completion_tokens for p in progress)


async def test_a_whole_body_larger_than_a_ray_message_goes_in_parts(monkeypatch):
    monkeypatch.setattr(replies, "MAX_PART_BYTES", 4)

    async def create(_):
        return b'{"id": "x"}'

    parts = await parts_of(StandInApi(create), {})
    assert b"".join(p.data for p in parts) == b'{"id": "x"}'
    assert [p.last for p in parts] == [False, False, True]


async def test_a_whole_reply_closed_by_its_caller_cancels_the_serving_layers_call():
    cancelled = asyncio.Event()

    async def create(_):
        counting._counted.get().prompt = 7
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    assert await parts_of(StandInApi(create), {}, limit=1) == [
        (b"", 7, 0, False, None, None, False)
    ]
    await asyncio.wait_for(cancelled.wait(), timeout=1)


@pytest.mark.parametrize(
    ("raised", "status", "message"),
    [
        (VLLMValidationError("bad top_k", parameter="top_k"), 400, "bad top_k"),
        (EngineDeadError(), 503, "The model engine stopped"),
    ],
)
async def test_what_the_serving_layer_raises_is_the_clients_error(raised, status, message):
    async def create(_):
        counting._counted.get().prompt = 3
        raise raised

    with pytest.raises((InvalidGenerationRequest, EngineUnavailable)) as failed:
        await parts_of(StandInApi(create), {})
    assert failed.value.status == status and message in failed.value.message
    assert failed.value.prompt_tokens == 3  # what the engine did before: the ingress charges it


async def test_a_serving_layer_error_response_names_the_field_the_client_sent():
    async def create(_):
        return error_response(
            "This model's maximum context length is 2048 tokens", 400, "input_tokens"
        )

    with pytest.raises(InvalidGenerationRequest) as refused:
        await parts_of(StandInApi(create), {})
    assert (refused.value.param, refused.value.code) == ("messages", "context_length_exceeded")


async def test_a_stream_comes_in_parts_and_marks_its_last():
    parts = await parts_of(
        streamed(Event(b"a"), Event(b"b"), Event(b"[DONE]", last=True)),
        {"stream": True},
        batched=False,
    )
    assert [(p.data, p.last, p.prompt_tokens) for p in parts] == [
        (b"a", False, 7),
        (b"b", False, 7),
        (b"[DONE]", True, 7),
    ]


async def test_events_that_arrive_together_are_taken_together():
    arrived = asyncio.Event()

    async def events():
        yield Event(b"1")
        yield Event(b"2")
        arrived.set()
        yield Event(b"3", last=True)

    batcher = EventBatcher(events())
    await arrived.wait()
    await asyncio.sleep(0)
    batches = [batch async for batch in batcher]
    await batcher.aclose()
    assert b"".join(b.data for b in batches) == b"123" and len(batches) < 3
    assert batches[-1].last


async def test_a_backlog_is_taken_in_batches_of_at_most_a_part(monkeypatch):
    monkeypatch.setattr(replies, "MAX_PART_BYTES", 20)
    arrived = asyncio.Event()

    async def events():
        for i in range(6):
            yield Event(b"data: %d\n\n" % i)  # 9 bytes each
        arrived.set()

    batcher = EventBatcher(events())
    await arrived.wait()
    await asyncio.sleep(0)
    batches = [batch async for batch in batcher]
    await batcher.aclose()
    assert [len(b.data) for b in batches] == [27, 27]


async def test_a_refusal_before_any_event_is_raised_before_any_part():
    """vLLM refuses some requests only once their stream runs (a token id out of the
    vocabulary): the client still gets the 400 as an HTTP status."""
    refused = InvalidGenerationRequest("Token id 600 is out of vocabulary")
    with pytest.raises(InvalidGenerationRequest, match="out of vocabulary"):
        await parts_of(streamed(then=refused), {"stream": True})


@pytest.mark.parametrize("batched", [True, False])
async def test_a_stream_that_fails_later_sends_what_came_before_then_raises(batched):
    parts = []
    with pytest.raises(EngineUnavailable) as failed:
        async for part in serve(
            streamed(Event(b"1"), then=RuntimeError("engine gone")),
            {"stream": True},
            batched=batched,
        ):
            parts.append(part)
    assert [p.data for p in parts] == [b"1"]
    assert failed.value.prompt_tokens == 7 and "Retry shortly" in failed.value.message


async def test_closing_the_batcher_closes_the_serving_layers_generator():
    closed = asyncio.Event()

    async def endless():
        try:
            while True:
                yield Event(b"x")
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    batcher = EventBatcher(endless())
    assert await anext(batcher)
    await batcher.aclose()
    assert closed.is_set()


async def sse_events(*lines: str) -> list:
    async def stream():
        for line in lines:
            yield line

    api = ChatApi(SimpleNamespace(create_chat_completion=None))
    return [event async for event in api.events(stream(), None)]


async def test_chat_events_mark_done_as_the_last():
    events = await sse_events("data: {}\n\n", "data: [DONE]\n\n")
    assert events == [Event(b"data: {}\n\n"), Event(b"data: [DONE]\n\n", last=True)]


@pytest.mark.parametrize(
    ("event", "status", "code"),
    [
        (
            'data: {"error": {"message": "bad stop", "type": "BadRequestError", '
            '"param": "stop", "code": 400}}\n\n',
            400,
            "invalid_value",
        ),
        (
            'data: {"error": {"message": "boom", "type": "InternalServerError", '
            '"param": null, "code": 500}}\n\n',
            503,
            "model_unavailable",
        ),
    ],
)
async def test_a_chat_error_event_is_raised_as_its_error(event, status, code):
    with pytest.raises((InvalidGenerationRequest, EngineUnavailable)) as raised:
        await sse_events("data: {}\n\n", event)
    assert (raised.value.status, raised.value.code) == (status, code)
    assert "boom" not in raised.value.message  # an engine's message stays in the log


ENDED = ErrorResponse.model_validate(
    {"error": {"message": "Internal server error", "type": "InternalServerError", "code": 500}}
)


@pytest.mark.parametrize(
    "ended",
    [VLLMGenerationError(), ENDED],
    ids=["raised", "error response"],
)
async def test_a_request_the_engine_ended_before_its_first_token_names_its_grammar(ended):
    """vLLM ends a request whose grammar the engine could not compile (past its budget) with
    only "Internal server error": a request that carried one hears which field to simplify."""

    async def create(_):
        counting._counted.get().prompt = 0
        if isinstance(ended, Exception):
            raise ended
        return ended

    with pytest.raises(InvalidGenerationRequest) as refused:
        await parts_of(StandInApi(create), {}, grammar="response_format")
    assert (refused.value.status, refused.value.code) == (400, "grammar_too_complex")
    assert refused.value.param == "response_format"
    assert "response_format" in refused.value.message and "budget of 10 s" in refused.value.message

    # Without a grammar, or once tokens came, it is the engine's failure: a 503 to retry.
    with pytest.raises(EndedInEngine):
        await parts_of(StandInApi(create), {})


async def test_a_stream_the_engine_ended_names_its_grammar_after_what_came_before():
    api = streamed(Event(b"data: {}\n\n"), then=EndedInEngine("ended"))

    served = serve(api, {"stream": True}, grammar="tools")
    assert (await anext(served)).data == b"data: {}\n\n"
    with pytest.raises(InvalidGenerationRequest) as refused:
        await anext(served)
    assert (refused.value.code, refused.value.param) == ("grammar_too_complex", "tools")


async def test_an_ended_stream_with_tokens_made_is_the_engines_failure():
    async def create(_):
        counting._counted.get().completion = 3
        return "stream"

    async def stream():
        yield Event(b"data: {}\n\n")
        raise EndedInEngine("ended")

    with pytest.raises(EndedInEngine):
        await parts_of(StandInApi(create, stream), {"stream": True}, grammar="tools")
