"""What the gateway refuses before a request touches a rate-limit counter or a replica."""

from __future__ import annotations

import pytest

from app.errors import ApiError
from app.protocol import ChatCompletionRequest, CompletionRequest
from app.observability.metrics import InFlight
from app.observability.request_record import CLIENT_CLOSED, RequestRecord
from app.relay import Tally, _events, check_against_model
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
