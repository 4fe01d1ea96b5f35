"""The pipeline's own steps: what it refuses before a counter or a replica, how it relays a stream."""

from __future__ import annotations

import asyncio

import pytest

from app.apis.chat.call import ChatCall
from app.apis.chat.protocol import ChatCompletionRequest
from app.apis.completions.call import CompletionCall
from app.apis.completions.protocol import CompletionRequest
from app.apis.responses.call import ResponsesCall
from app.apis.responses.protocol import ResponseCreateRequest
from app.limits.ticket import Meter
from app.observability.metrics import InFlight
from app.observability.request_record import CLIENT_CLOSED, RequestRecord
from app.openai.errors import ApiError
from app.openai.protocol import ReplyLength
from app.serving.checks import PROMPT_BYTES_BOUND, check_prompt_length, check_reply_length
from app.serving.pipeline import Tally, _relay
from deployments.wire import ModelInfo, ReplyPart
from tests.app.shipped_plans import FAST, PRO, caller

HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
WITH_PARSER = ModelInfo("ServiceAi-Fast", 2048, "hermes")
WITHOUT_PARSER = ModelInfo("ServiceAi-Coder", 2048, None)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": HI, **fields})


def responses(**fields) -> ResponsesCall:
    body = ResponseCreateRequest.model_validate({"model": "m", "input": "hi", **fields})
    return ResponsesCall(body, caller=None, store=None)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (ChatCall(chat(max_tokens=2048)), "max_tokens"),
        (ChatCall(chat(max_tokens=10, max_completion_tokens=5000)), "max_completion_tokens"),
        (
            CompletionCall(
                CompletionRequest.model_validate({"model": "m", "prompt": "x", "max_tokens": 9999})
            ),
            "max_tokens",
        ),
        (responses(max_output_tokens=2048), "max_output_tokens"),
    ],
)
def test_a_reply_beyond_the_context_is_400_naming_the_apis_field(call, param):
    with pytest.raises(ApiError) as info:
        check_reply_length(call.reply, WITH_PARSER)
    assert (info.value.status, info.value.code, info.value.param) == (
        400,
        "context_length_exceeded",
        param,
    )


@pytest.mark.parametrize(
    ("choice", "needs_a_parser"),
    [
        (None, True),
        ("auto", True),
        ("required", False),
        ({"type": "function", "function": {"name": "f"}}, False),
    ],
)
def test_an_automatic_tool_choice_needs_a_parser_a_forced_one_does_not(choice, needs_a_parser):
    """A forced call is JSON constrained to the schema, on any type; an automatic one needs
    the type's parser to find a call in the model's own format. Chat and responses alike."""

    def responses_choice(c):
        return {"type": "function", "name": "f"} if isinstance(c, dict) else c

    calls = [
        lambda c: ChatCall(chat(tools=TOOLS, **({} if c is None else {"tool_choice": c}))),
        lambda c: responses(
            tools=[{"type": "function", "name": "f"}],
            **({} if c is None else {"tool_choice": responses_choice(c)}),
        ),
    ]
    for make in calls:
        make(choice).check_against_model(WITH_PARSER)
        make("none").check_against_model(WITHOUT_PARSER)
        if not needs_a_parser:
            make(choice).check_against_model(WITHOUT_PARSER)
            continue
        with pytest.raises(ApiError) as info:
            make(choice).check_against_model(WITHOUT_PARSER)
        assert info.value.param == "tool_choice" and "no tool-call parser" in info.value.message


def test_reasoning_needs_a_reasoning_parser_with_the_same_answer_on_every_api():
    from app.apis.messages.call import MessagesCall
    from app.apis.messages.protocol import MessagesRequest

    hi = [{"role": "user", "content": "hi"}]
    asking = [
        (ChatCall(chat(reasoning_effort="low")), "reasoning_effort"),
        (responses(reasoning={"effort": "high"}), "reasoning"),
        (
            MessagesCall(
                MessagesRequest(
                    model=FAST,
                    max_tokens=2048,
                    messages=hi,
                    thinking={"type": "enabled", "budget_tokens": 1024},
                )
            ),
            "thinking",
        ),
    ]
    reasons = WITH_PARSER._replace(reasoning_parser="deepseek_v3")
    for call, param in asking:
        with pytest.raises(ApiError) as info:
            call.check_against_model(WITH_PARSER)
        assert (info.value.status, info.value.code, info.value.param) == (
            400,
            "unsupported_parameter",
            param,
        )
        assert info.value.message.startswith(f"{FAST} does not reason before answering: {param}")
        call.check_against_model(reasons)
    # Effort none asks for no reasoning, nor does a Messages effort without `thinking`: served
    # on any type.
    responses(reasoning={"effort": "none"}).check_against_model(WITH_PARSER)
    effort_alone = MessagesRequest(
        model=FAST, max_tokens=5, messages=hi, output_config={"effort": "low"}
    )
    MessagesCall(effort_alone).check_against_model(WITH_PARSER)
    assert effort_alone.to_engine()["thinking"] == {"type": "disabled"}


async def test_a_reply_larger_than_the_whole_plan_is_429_without_retry(limits):  # noqa: F811
    tokens_per_minute = limits.plan_limits("free").on(PRO).tokens_per_minute
    with pytest.raises(ApiError) as info:
        limits.check_fits(caller(), PRO, ReplyLength("max_tokens", tokens_per_minute + 1))
    assert info.value.status == 429
    assert info.value.headers == {"x-should-retry": "false"}
    limits.check_fits(caller(), PRO, ReplyLength("max_tokens", tokens_per_minute))
    limits.check_fits(caller(), FAST, ReplyLength("max_tokens", None))


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


BEYOND = ApiError(
    400,
    "This model's maximum context length is 2048 tokens.",
    param="messages",
    code="context_length_exceeded",
)
SHORTEST_MEASURED = -(-(2048 - 134) // PROMPT_BYTES_BOUND)  # bytes, with 134 template tokens


async def requests_used(limits, who) -> int:  # noqa: F811
    keys = limits._keys(who, FAST, limits.plan_limits(who.plan).on(FAST))
    await limits.written()  # refuse() waits for the count only so long
    return await limits.counters.requests_used(keys)


async def test_a_body_too_short_to_overflow_goes_straight_on(limits):  # noqa: F811
    replica, who = _Replica(BEYOND), caller()
    info = ModelInfo(FAST, 2048, "hermes", None, 134)
    await check_prompt_length(limits, who, replica, info, "chat", {}, SHORTEST_MEASURED - 1)
    assert replica.asked == [] and await requests_used(limits, who) == 0


async def test_a_long_prompt_beyond_the_context_is_refused_before_admission(limits):  # noqa: F811
    replica, who = _Replica(BEYOND), caller()
    info = ModelInfo(FAST, 2048, "hermes", None, 134)
    for _ in range(3):
        with pytest.raises(ApiError) as refused:
            await check_prompt_length(
                limits, who, replica, info, "chat", {"messages": HI}, SHORTEST_MEASURED
            )
        assert refused.value is BEYOND
    assert replica.asked == [("chat", {"messages": HI})] * 3
    # Counted as a refused body (a replica rendered it), and no concurrency slot was taken.
    assert await requests_used(limits, who) == 3
    admission = await limits.admit(who, FAST, None)
    assert admission.headers["x-ratelimit-remaining-requests"] == str(
        limits.plan_limits(who.plan).on(FAST).requests_per_minute - 4
    )


async def test_a_long_prompt_that_fits_is_admitted_as_usual(limits):  # noqa: F811
    replica, who = _Replica(), caller()
    await check_prompt_length(
        limits, who, replica, WITH_PARSER, "completion", {"prompt": "p"}, 4000
    )
    assert replica.asked == [("completion", {"prompt": "p"})]
    assert await requests_used(limits, who) == 0


async def test_a_caller_without_requests_left_gets_admissions_429_not_a_replicas_work(limits):  # noqa: F811
    replica, who = _Replica(BEYOND), caller()
    per_minute = limits.plan_limits(who.plan).on(FAST).requests_per_minute
    for _ in range(per_minute):
        limits.count_refused(who, FAST)
    assert await requests_used(limits, who) == per_minute
    await check_prompt_length(limits, who, replica, WITH_PARSER, "chat", {}, 4000)
    assert replica.asked == []
    with pytest.raises(ApiError) as refused:
        await limits.admit(who, FAST, None)
    assert refused.value.status == 429


class _Parts:
    """The replica's stream as the handle yields it (`cancel` is what the relay may call)."""

    def __init__(self, *parts: ReplyPart, then: Exception | None = None) -> None:
        self._parts = iter(parts)
        self._then = then
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> ReplyPart:
        try:
            return next(self._parts)
        except StopIteration:
            if self._then is not None:
                raise self._then from None
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        self.cancelled = True


def _charged(charges: list[tuple[int, int]] | None = None):
    """A Charge that records its charges; its write is done at once."""

    def settle(prompt_tokens: int, completion_tokens: int) -> asyncio.Future[None]:
        if charges is not None:
            charges.append((prompt_tokens, completion_tokens))
        written = asyncio.get_running_loop().create_future()
        written.set_result(None)
        return written

    return settle


class _Endpoint:
    """What the relay asks of an endpoint: the API error for a failure."""

    def error(self, exc: BaseException) -> ApiError:
        return ApiError(503, "gone", type="server_error", code="model_unavailable")


async def test_a_stream_is_complete_once_its_last_part_is_written():
    # OpenAI's client hangs up as soon as it reads `data: [DONE]`: the relay must not need to
    # be resumed after writing the last events to count the stream as complete.
    first = ReplyPart(b"data: {}\n\n", 7, 1)
    last = ReplyPart(b"data: {}\n\ndata: [DONE]\n\n", 7, 3, True)
    stream, record = _Parts(last), RequestRecord("r", 0.0, InFlight())
    record.sent_to(FAST, stream=True)
    charges: list[tuple[int, int]] = []
    tally = Tally(first, Meter(_charged(charges)), record)
    events = _relay(ChatCall(chat(stream=True)), _Endpoint(), stream, tally)
    assert await anext(events) == first.data
    assert charges == []
    # Charged, and the slot free, before the client can read the end and send again.
    assert await anext(events) == last.data
    assert charges == [(7, 3)]
    await events.aclose()  # the client left: the generator is never resumed
    tally.on_close(stream)()
    assert charges == [(7, 3)]  # once
    assert tally.finished and (record.status(200), record.completion_tokens) == (200, 3)


async def test_a_streams_record_counts_what_it_was_charged_and_times_its_first_token():
    """A Responses stream's first part (`response.created`) comes before the engine has
    counted the prompt or made a token: the metrics and the access line count what the meter
    charged at the end, and the first token is the first part with one."""
    created = ReplyPart(b"event: response.created\n\n", 0, 0)
    token = ReplyPart(b"event: response.output_text.delta\n\n", 9, 1)
    last = ReplyPart(b"event: response.completed\n\n", 9, 4, True)
    record = RequestRecord("r", 0.0, InFlight())
    record.sent_to(FAST, stream=True)
    charges: list[tuple[int, int]] = []
    stream = _Parts(token, last)
    tally = Tally(created, Meter(_charged(charges)), record)
    events = _relay(responses(stream=True), _Endpoint(), stream, tally)
    await anext(events)
    assert record.first_token_at is None and record.in_flight.waiting[FAST] == 1
    await anext(events)
    assert record.first_token_at is not None and record.in_flight.streaming[FAST] == 1
    assert [e async for e in events] == [last.data]
    tally.on_close(stream)()
    assert charges == [(9, 4)]
    assert (record.prompt_tokens, record.completion_tokens) == (9, 4)


@pytest.mark.parametrize(
    ("call", "framed"),
    [
        (
            ChatCall(chat(stream=True)),
            b'data: {"error":{"message":"gone","type":"server_error",'
            b'"param":null,"code":"model_unavailable"}}\n\ndata: [DONE]\n\n',
        ),
        (
            responses(stream=True),
            b'event: error\ndata: {"type":"error","error":{"message":'
            b'"gone","type":"server_error","param":null,"code":"model_unavailable"}}\n\n',
        ),
    ],
)
async def test_a_stream_that_fails_or_ends_early_ends_with_its_apis_error_event(call, framed):
    for rest in (_Parts(then=RuntimeError("replica died")), _Parts()):
        record = RequestRecord("r", 0.0, InFlight())
        record.sent_to(FAST, stream=True)
        tally = Tally(ReplyPart(b"data: {}\n\n", 7, 1), Meter(_charged()), record)
        events = [e async for e in _relay(call, _Endpoint(), rest, tally)]
        assert events == [b"data: {}\n\n", framed]
        assert tally.finished and record.status(200) == 503


async def test_a_stream_cut_before_its_end_is_a_client_closed_request():
    first = ReplyPart(b"data: {}\n\n", 7, 1)
    stream, record = _Parts(ReplyPart(b"data: {}\n\n", 7, 2)), RequestRecord("r", 0.0, InFlight())
    record.sent_to(FAST, stream=True)
    tally = Tally(first, Meter(_charged()), record)
    events = _relay(ChatCall(chat(stream=True)), _Endpoint(), stream, tally)
    await anext(events)
    await anext(events)
    await events.aclose()
    assert not tally.finished and record.status(200) == CLIENT_CLOSED


class _Slow(_Parts):
    """A replica whose next part comes only once `go` is set (a queue, a long prefill)."""

    def __init__(self, *parts: ReplyPart) -> None:
        super().__init__(*parts)
        self.go = asyncio.Event()

    async def __anext__(self) -> ReplyPart:
        await self.go.wait()
        return await super().__anext__()


async def test_a_messages_stream_sends_ping_while_it_waits_and_others_send_nothing(monkeypatch):
    from app.apis.messages.call import MessagesCall
    from app.apis.messages.protocol import MessagesRequest
    from app.serving import pipeline

    monkeypatch.setattr(pipeline, "KEEPALIVE_S", 0.01)
    first = ReplyPart(b"event: message_start\n\n", 7, 0)
    last = ReplyPart(b"event: message_stop\n\n", 7, 2, True)
    body = MessagesRequest(
        model=FAST, max_tokens=5, stream=True, messages=[{"role": "user", "content": "hi"}]
    )
    stream, record = _Slow(last), RequestRecord("r", 0.0, InFlight())
    record.sent_to(FAST, stream=True)
    events = _relay(
        MessagesCall(body), _Endpoint(), stream, Tally(first, Meter(_charged()), record)
    )
    assert await anext(events) == first.data
    ping = b'event: ping\ndata: {"type": "ping"}\n\n'
    assert [await anext(events), await anext(events)] == [ping, ping]
    stream.go.set()
    rest = [e async for e in events]
    assert rest[-1] == last.data and set(rest[:-1]) <= {ping}
    # A client that leaves while the stream waits: the wait ends with it.
    stream = _Slow(last)
    events = _relay(
        MessagesCall(body), _Endpoint(), stream, Tally(first, Meter(_charged()), record)
    )
    await anext(events)
    assert await anext(events) == ping
    await events.aclose()
    # Chat waits silently, as OpenAI's streams do.
    stream = _Slow(last)
    chat_events = _relay(
        ChatCall(chat(stream=True)), _Endpoint(), stream, Tally(first, Meter(_charged()), record)
    )
    await anext(chat_events)
    waiting = asyncio.ensure_future(anext(chat_events))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    stream.go.set()
    assert await waiting == last.data
