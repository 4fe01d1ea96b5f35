"""What the gateway refuses before a request touches a rate-limit counter or a replica."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from app.errors import ApiError
from app.protocol import ChatCompletionRequest, CompletionRequest
from app.observability.metrics import InFlight
from app.observability.request_record import CLIENT_CLOSED, RequestRecord
from app.relay import PROMPT_BYTES_BOUND, Tally, _events, check_against_model, check_prompt_length
from deployments.generation import ModelInfo, ReplyPart
from tests.app.test_ratelimit import FAST, PRO, caller, limits  # noqa: F401 (fixture)

HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
WITH_PARSER = ModelInfo("ServiceAi-Fast", 2048, "hermes")
WITHOUT_PARSER = ModelInfo("ServiceAi-Coder", 2048, None)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": HI, **fields})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(max_tokens=2048), "max_tokens"),
        (chat(max_tokens=10, max_completion_tokens=5000), "max_completion_tokens"),
        (CompletionRequest.model_validate({"model": "m", "prompt": "x", "max_tokens": 9999}),
         "max_tokens"),
    ],
)
def test_a_reply_beyond_the_context_is_400(body, param):
    with pytest.raises(ApiError) as info:
        check_against_model(body, WITH_PARSER)
    assert (info.value.status, info.value.code, info.value.param) == (
        400, "context_length_exceeded", param
    )


@pytest.mark.parametrize("choice", [None, "auto", "required", {"type": "function", "function": {"name": "f"}}])
def test_tool_calls_need_a_parser(choice):
    body = chat(tools=TOOLS, **({} if choice is None else {"tool_choice": choice}))
    check_against_model(body, WITH_PARSER)
    with pytest.raises(ApiError) as info:
        check_against_model(body, WITHOUT_PARSER)
    assert info.value.param == "tool_choice" and "no tool-call parser" in info.value.message
    check_against_model(chat(tools=TOOLS, tool_choice="none"), WITHOUT_PARSER)


def test_reasoning_effort_needs_a_reasoning_parser():
    with pytest.raises(ApiError) as info:
        check_against_model(chat(reasoning_effort="low"), WITH_PARSER)
    assert info.value.param == "reasoning_effort"


async def test_a_reply_larger_than_the_whole_plan_is_429_without_retry(limits):  # noqa: F811
    tokens_per_minute = limits.plan_limits("free").on(PRO).tokens_per_minute
    with pytest.raises(ApiError) as info:
        limits.check_fits(caller(), PRO, tokens_per_minute + 1)
    assert info.value.status == 429
    assert info.value.headers == {"x-should-retry": "false"}
    limits.check_fits(caller(), PRO, tokens_per_minute)
    limits.check_fits(caller(), FAST, None)


class _Replica:
    """A model type's endpoint as check_prompt_length calls it: the prompts it was asked to
    measure, and the refusal (if any) its renderer answers with."""

    name = FAST

    def __init__(self, refusal: ApiError | None = None) -> None:
        self.refusal = refusal
        self.asked: list[tuple[str, dict]] = []

    async def prompt_tokens(self, api: str, body: dict) -> int:
        self.asked.append((api, body))
        if self.refusal is not None:
            raise self.refusal
        return 10


def _request(limits, size: int) -> SimpleNamespace:  # noqa: F811
    async def body() -> bytes:
        return b"x" * size

    return SimpleNamespace(body=body, app=SimpleNamespace(state=SimpleNamespace(limits=limits)))


BEYOND = ApiError(400, "This model's maximum context length is 2048 tokens.",
                  param="messages", code="context_length_exceeded")
SHORTEST_MEASURED = -(-(2048 - 134) // PROMPT_BYTES_BOUND)  # bytes, with 134 template tokens


async def requests_used(limits, who) -> int:  # noqa: F811
    key = limits._counters(who, FAST, limits.plan_limits(who.plan).on(FAST)).requests_key()
    await asyncio.sleep(0.05)  # count_refused writes off the response path
    return await limits.storage.get(key)


async def test_a_body_too_short_to_overflow_goes_straight_on(limits):  # noqa: F811
    replica, who = _Replica(BEYOND), caller()
    info = ModelInfo(FAST, 2048, "hermes", None, 134)
    await check_prompt_length(_request(limits, SHORTEST_MEASURED - 1), who, replica, info,
                              "chat", {})
    assert replica.asked == [] and await requests_used(limits, who) == 0


async def test_a_long_prompt_beyond_the_context_is_refused_before_admission(limits):  # noqa: F811
    replica, who = _Replica(BEYOND), caller()
    info = ModelInfo(FAST, 2048, "hermes", None, 134)
    for _ in range(3):
        with pytest.raises(ApiError) as refused:
            await check_prompt_length(_request(limits, SHORTEST_MEASURED), who, replica, info,
                                      "chat", {"messages": HI})
        assert refused.value is BEYOND
    assert replica.asked == [("chat", {"messages": HI})] * 3
    # Counted as a refused body (a replica rendered it), and no concurrency slot was taken.
    assert await requests_used(limits, who) == 3
    admission = await limits.admit(who, FAST, None)
    assert admission.headers["x-ratelimit-remaining-requests"] == str(
        limits.plan_limits(who.plan).on(FAST).requests_per_minute - 4)


async def test_a_long_prompt_that_fits_is_admitted_as_usual(limits):  # noqa: F811
    replica, who = _Replica(), caller()
    await check_prompt_length(_request(limits, 4000), who, replica, WITH_PARSER, "completion",
                              {"prompt": "p"})
    assert replica.asked == [("completion", {"prompt": "p"})]
    assert await requests_used(limits, who) == 0


async def test_a_caller_without_requests_left_gets_admissions_429_not_a_replicas_work(limits):  # noqa: F811
    replica, who = _Replica(BEYOND), caller()
    per_minute = limits.plan_limits(who.plan).on(FAST).requests_per_minute
    for _ in range(per_minute):
        limits.count_refused(who, FAST)
    assert await requests_used(limits, who) == per_minute
    await check_prompt_length(_request(limits, 4000), who, replica, WITH_PARSER, "chat", {})
    assert replica.asked == []
    with pytest.raises(ApiError) as refused:
        await limits.admit(who, FAST, None)
    assert refused.value.status == 429


class _Parts:
    """The replica's stream as the handle yields it (`cancel` is what the relay may call)."""

    def __init__(self, *parts: ReplyPart) -> None:
        self._parts = iter(parts)
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> ReplyPart:
        try:
            return next(self._parts)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        self.cancelled = True


@pytest.mark.parametrize(("ended", "status"), [(200, 200), (503, 503)])
async def test_a_stream_is_complete_once_its_last_part_is_written(ended, status):
    # OpenAI's client hangs up as soon as it reads `data: [DONE]`: the relay must not need to
    # be resumed after writing the last events to count the stream as complete.
    first = ReplyPart(b"data: {}\n\n", 7, 1)
    last = ReplyPart(b"data: {}\n\ndata: [DONE]\n\n", 7, 3, ended)
    stream, record = _Parts(last), RequestRecord("r", 0.0, InFlight())
    record.sent_to(FAST, stream=True)
    tally = Tally(first)
    events = _events(None, stream, tally, record)
    assert [await anext(events), await anext(events)] == [first.data, last.data]
    await events.aclose()  # the client left: the generator is never resumed
    assert tally.finished and (record.status(200), record.completion_tokens) == (status, 3)


async def test_a_stream_cut_before_its_end_is_a_client_closed_request():
    first = ReplyPart(b"data: {}\n\n", 7, 1)
    stream, record = _Parts(ReplyPart(b"data: {}\n\n", 7, 2)), RequestRecord("r", 0.0, InFlight())
    record.sent_to(FAST, stream=True)
    tally = Tally(first)
    events = _events(None, stream, tally, record)
    await anext(events)
    await anext(events)
    await events.aclose()
    assert not tally.finished and record.status(200) == CLIENT_CLOSED
