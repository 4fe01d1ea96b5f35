"""What the gateway refuses before a request touches a rate-limit counter or a replica."""

from __future__ import annotations

import pytest

from app.errors import ApiError
from app.protocol import ChatCompletionRequest, CompletionRequest
from app.relay import check_against_model
from deployments.generation import ModelInfo
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
