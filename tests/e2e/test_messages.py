"""Anthropic's Messages API through Anthropic's own Python SDK: create, stream, system, forced
tools and their result turn, count_tokens, and Anthropic's error classes, on the shared stack."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.conftest import Stack
from tests.e2e.test_key_scopes import scoped_key

FAST = "ServiceAi-Fast"
HI = [{"role": "user", "content": "hi"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def claude(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.origin, api_key=stack.api_key, max_retries=0)


def test_a_message_is_anthropics_shape_with_the_engines_usage(claude):
    message = claude.messages.create(model=FAST, max_tokens=8, messages=HI, system="Be brief.")
    assert (message.type, message.role, message.model) == ("message", "assistant", FAST)
    assert message.content[0].type == "text"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 8
    counted = claude.messages.count_tokens(model=FAST, messages=HI, system="Be brief.")
    assert counted.input_tokens == message.usage.input_tokens


def test_claude_codes_own_model_ids_reach_the_types_the_config_maps_them_to(claude):
    """serve_config.yaml's model_aliases: claude-*haiku* is Fast, any other claude-* is Pro."""
    haiku = claude.messages.create(model="claude-haiku-4-5-20251001", max_tokens=2, messages=HI)
    sonnet = claude.messages.create(model="claude-sonnet-4-5-20250929", max_tokens=2, messages=HI)
    assert (haiku.model, sonnet.model) == (FAST, "ServiceAi-Pro")
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="gpt-4o", max_tokens=2, messages=HI)


def test_a_stream_is_anthropics_event_sequence_and_its_final_message(claude, stack: Stack):
    # Greedy: a random-weight model sampling may end at once, and a reply with no text has no
    # content block (as Anthropic's own); the tiny model's greedy reply to HI has text.
    with claude.messages.stream(
        model=FAST, max_tokens=12, messages=HI, extra_body={"temperature": 0}
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == text
    assert final.usage.output_tokens > 0 and final.stop_reason in ("end_turn", "max_tokens")
    with httpx.stream(
        "POST",
        f"{stack.origin}/v1/messages?beta=true",
        headers={"x-api-key": stack.api_key, "anthropic-version": "2023-06-01"},
        json={"model": FAST, "max_tokens": 4, "messages": HI, "stream": True, "temperature": 0},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        events = [line[7:] for line in response.iter_lines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "message_delta" in events


def test_a_forced_tool_is_called_with_input_that_holds_to_its_schema_and_its_result_goes_back(
    claude,
):
    message = claude.messages.create(
        model=FAST,
        max_tokens=200,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input["city"], str)
    assert len(call.input["city"]) <= 12
    answer = claude.messages.create(
        model=FAST,
        max_tokens=8,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [call.model_dump(exclude={"caller"})]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}],
            },
        ],
        tool_choice={"type": "none"},
    )
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens")


def test_failures_are_anthropics_error_classes_in_its_envelope(claude, stack: Stack):
    stranger = anthropic.Anthropic(base_url=stack.origin, api_key="sai-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        stranger.messages.create(model=FAST, max_tokens=4, messages=HI)
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="ServiceAi-Nope", max_tokens=4, messages=HI)
    assert missing.value.body["type"] == "error"
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model=FAST, max_tokens=4, messages=HI, extra_body={"container": "c1"}
        )
    assert "container" in refused.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as thinking:
        claude.messages.create(
            model=FAST,
            max_tokens=64,
            messages=HI,
            thinking={"type": "enabled", "budget_tokens": 32},
        )
    assert "thinking" in thinking.value.body["error"]["message"]
    response = httpx.post(
        f"{stack.origin}/v1/messages",
        headers={"x-api-key": stack.api_key},
        json={"model": FAST, "messages": HI},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in response.json()["error"]["message"]


def test_a_key_scoped_elsewhere_or_past_its_rate_gets_anthropics_classes(stack: Stack):
    """The same scopes and limits as every API: a key for Coder only, 2 requests a minute."""
    key = scoped_key(stack, "--models", "ServiceAi-Coder", "--requests-per-minute", "2")
    client = anthropic.Anthropic(base_url=stack.origin, api_key=key["key"], max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        client.messages.create(model=FAST, max_tokens=2, messages=HI)
    assert denied.value.body["error"]["type"] == "permission_error"
    assert "ServiceAi-Coder" in denied.value.body["error"]["message"]
    for _ in range(2):
        client.messages.create(model="ServiceAi-Coder", max_tokens=2, messages=HI)
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(model="ServiceAi-Coder", max_tokens=2, messages=HI)
    headers = limited.value.response.headers
    assert limited.value.body["error"]["type"] == "rate_limit_error"
    assert int(headers["retry-after"]) > 0
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"


def test_a_repeated_prefix_is_read_from_the_engines_cache_as_anthropic_reports_it(claude):
    """cache_control marks are accepted (the engine caches every prefix on its own), and the
    cached part of the prompt comes back as usage.cache_read_input_tokens."""
    system = [
        {
            "type": "text",
            "text": "You answer questions about the weather. " * 30,
            "cache_control": {"type": "ephemeral"},
        }
    ]
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    for _ in range(2):
        usage = claude.messages.create(
            model=FAST, max_tokens=2, system=system, messages=messages
        ).usage
    assert (usage.cache_read_input_tokens or 0) >= 256  # some blocks of the 30 sentences


def test_any_tool_without_parallel_calls_is_one_call(claude):
    message = claude.messages.create(
        model=FAST,
        max_tokens=200,
        messages=[{"role": "user", "content": "Weather in Paris and Rome?"}],
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    calls = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and len(calls) == 1
    assert isinstance(calls[0].input["city"], str)
