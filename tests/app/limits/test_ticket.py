"""A request's ticket: the payload it shapes, and one charge on every way out of the block."""

from __future__ import annotations

import asyncio

import pytest

from app.accounts.keystore import KeyStore
from app.limits.usage_meter import UsageMeter
from app.openai.errors import ApiError
from app.openai.protocol import ReplyLength
from deployments.wire import ModelInfo, ReplyPart
from tests.app.shipped_plans import FAST, PRO, caller

MODEL = ModelInfo(PRO, 4096, priority_scheduling=True)
HUNDRED = ReplyLength("max_tokens", 100)
UNBOUNDED = ReplyLength("max_tokens", None)


@pytest.fixture
def usage(store: KeyStore) -> UsageMeter:
    return UsageMeter(store)


def pending(usage: UsageMeter) -> list[tuple[int, int, int]]:
    """(requests, prompt, completion tokens) metered so far, per key and type."""
    return [(c.requests, c.prompt_tokens, c.completion_tokens) for c in usage._pending.values()]


async def in_flight(limits, who) -> int:
    """How many of the caller's two slots on PRO are taken: what admitting into them leaves."""
    held = []
    try:
        for _ in range(2):
            held.append(await limits.admit(who, PRO, 1))
    except ApiError as error:
        assert error.code == "rate_limit_exceeded" and "concurrent" in error.message
    for admission in held:
        admission.settle(0, 0)
    await limits.written()
    return 2 - len(held)


async def test_a_whole_reply_is_charged_once_to_the_plan_and_the_key(limits, usage):
    who = caller()
    ticket = await limits.open(who, PRO, HUNDRED, model=MODEL, usage=usage)
    async with ticket.charging() as meter:
        meter.count(ReplyPart(b"", 7, 40))
        meter.count(ReplyPart(b"{}", 7, 64, last=True))
        meter.charge()
        meter.charge()
    assert pending(usage) == [(1, 7, 64)]
    await limits.written()
    after = await limits.open(who, PRO, HUNDRED, model=MODEL, usage=usage)
    # 71 tokens charged in place of the 100 reserved; this request holds its own 100.
    assert after.headers["x-ratelimit-remaining-tokens"] == str(20_000 - 71 - 100)


async def test_an_error_is_charged_what_the_engine_did_and_leaves_with_the_plans_headers(
    limits, usage
):
    ticket = await limits.open(caller(), PRO, HUNDRED, model=MODEL, usage=usage)
    with pytest.raises(ApiError) as info:
        async with ticket.charging() as meter:
            meter.count(ReplyPart(b"", 7, 12))
            raise ApiError(503, "gone", type="server_error", code="model_unavailable")
    assert info.value.headers["x-ratelimit-limit-tokens"] == "20000"
    assert pending(usage) == [(1, 7, 12)]


async def test_a_request_its_client_left_is_charged_and_frees_its_slot(limits, usage):
    who = caller()
    ticket = await limits.open(who, PRO, HUNDRED, model=MODEL, usage=usage)
    with pytest.raises(asyncio.CancelledError):
        async with ticket.charging() as meter:
            meter.count(ReplyPart(b"", 9, 3))
            raise asyncio.CancelledError
    await limits.written()
    assert pending(usage) == [(1, 9, 3)]
    assert await in_flight(limits, who) == 0


async def test_a_failure_before_the_engine_did_anything_frees_the_slot_and_meters_nothing(
    limits, usage
):
    who = caller()
    ticket = await limits.open(who, PRO, HUNDRED, model=MODEL, usage=usage)
    with pytest.raises(ApiError):
        async with ticket.charging():
            raise ApiError(503, "at capacity", type="server_error", code="model_overloaded")
    await limits.written()
    assert pending(usage) == []
    assert await in_flight(limits, who) == 0


async def test_a_stream_is_charged_at_its_end_not_when_the_block_is_left(limits, usage):
    who = caller()
    ticket = await limits.open(who, PRO, HUNDRED, model=MODEL, usage=usage)
    async with ticket.charging() as meter:
        meter.count(ReplyPart(b"data: {}\n\n", 7, 1))
        meter.handed_to_stream()
    assert pending(usage) == []
    assert await in_flight(limits, who) == 1
    meter.count(ReplyPart(b"data: [DONE]\n\n", 7, 30, last=True))
    await meter.settle()
    meter.charge()  # the response's close charges again: nothing more
    assert pending(usage) == [(1, 7, 30)]
    assert await in_flight(limits, who) == 0


async def test_the_ticket_sets_the_plans_cap_and_priority_in_the_payload(limits, usage):
    ticket = await limits.open(caller(), PRO, UNBOUNDED, model=MODEL, usage=usage)
    payload: dict = {}
    ticket.shape(payload, UNBOUNDED, MODEL)
    assert payload == {"max_tokens": 4096, "priority": 10}
    payload = {"max_tokens": 50}
    ticket.shape(payload, ReplyLength("max_tokens", 50), MODEL._replace(priority_scheduling=False))
    assert payload == {"max_tokens": 50}  # the client's own limit, an engine with no priorities
    fast = await limits.open(caller(), FAST, UNBOUNDED, model=MODEL, usage=usage)
    payload = {}
    fast.shape(payload, ReplyLength("max_completion_tokens", None), MODEL)
    assert payload["priority"] == limits.plan_limits("free").priority
