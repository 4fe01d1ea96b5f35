"""The rest of OpenAI's chat API through the gateway, with the official client, whole and streamed.

The tiny model's weights are random: these tests check shapes and constraints (a schema the
output must match, a token the bias forces), never the quality of what it writes.
"""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.conftest import error_of

HI = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
        "unit": {"type": "string", "enum": ["C", "F"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The forecast for a city.",
            "parameters": WEATHER_PARAMETERS,
        },
    }
]
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["city", "score"],
    "additionalProperties": False,
}


def stream_text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# Structured outputs


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_matches_the_schema(client, stream):
    request = dict(
        model="ServiceAi-Fast",
        messages=HI,
        max_tokens=200,
        seed=1,
        stream=stream,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
        },
    )
    reply = client.chat.completions.create(**request)
    text = stream_text(reply) if stream else reply.choices[0].message.content
    jsonschema.validate(json.loads(text), CITY_SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_json_object_output_is_a_json_object(client, stream):
    reply = client.chat.completions.create(
        model="ServiceAi-Pro",
        messages=HI,
        max_tokens=300,
        seed=3,
        stream=stream,
        response_format={"type": "json_object"},
    )
    text = stream_text(reply) if stream else reply.choices[0].message.content
    assert isinstance(json.loads(text), dict)


class City(BaseModel):
    """Closed choices: random weights would fill a free string until max_tokens."""

    name: Literal["Paris", "Berlin"]
    capital: bool


def test_client_parse_returns_the_pydantic_model(client):
    completion = client.chat.completions.parse(
        model="ServiceAi-Fast", messages=HI, max_tokens=200, seed=5, response_format=City
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City)


def test_invalid_schema_is_400_naming_response_format(http):
    response = http.post(
        "/v1/chat/completions",
        json={
            "model": "ServiceAi-Fast",
            "messages": HI,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "no-such-type"}},
            },
        },
    )
    error = error_of(response, 400)
    assert error["param"] == "response_format"
    assert "no-such-type" in error["message"] and "<path>" not in error["message"]


# Tools


def assert_weather_call(call) -> None:
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)


def test_the_agent_loops_next_turn_is_accepted(client):
    """Forced calls themselves: tests/e2e/test_tool_calls.py."""
    first = client.chat.completions.create(
        model="ServiceAi-Fast",
        messages=HI,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
    )
    call = first.choices[0].message.tool_calls[0]
    assert_weather_call(call)
    messages = [
        *HI,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'},
    ]
    for stream in (False, True):
        reply = client.chat.completions.create(
            model="ServiceAi-Fast", messages=messages, tools=TOOLS, max_tokens=8, stream=stream
        )
        if stream:
            assert list(reply)[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
        else:
            assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_auto_tool_choice_with_a_parser_is_served(client):
    response = client.chat.completions.create(
        model="ServiceAi-Fast",
        messages=HI,
        tools=TOOLS,
        tool_choice="auto",
        max_tokens=8,
        parallel_tool_calls=False,
    )
    assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_none_on_a_type_without_a_parser_is_served(client):
    response = client.chat.completions.create(
        model="ServiceAi-Coder", messages=HI, tools=TOOLS, tool_choice="none", max_tokens=3
    )
    assert response.choices[0].message.tool_calls in (None, [])


# Logprobs and logit_bias


def test_logprobs_one_entry_per_token(client):
    response = client.chat.completions.create(
        model="ServiceAi-Fast",
        messages=HI,
        max_tokens=9,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens == 9
    assert all(len(entry.top_logprobs) == 3 and entry.logprob <= 0 for entry in content)


def test_streamed_logprobs_one_entry_per_token(client):
    entries = []
    usage = None
    for chunk in client.chat.completions.create(
        model="ServiceAi-Fast",
        messages=HI,
        max_tokens=9,
        logprobs=True,
        top_logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        usage = chunk.usage or usage
        if chunk.choices and chunk.choices[0].logprobs:
            entries += chunk.choices[0].logprobs.content
    assert len(entries) == usage.completion_tokens == 9
    assert all(len(entry.top_logprobs) == 2 for entry in entries)


@pytest.mark.parametrize("stream", [False, True])
def test_logit_bias_makes_one_token_dominate(client, stream):
    reply = client.chat.completions.create(
        model="ServiceAi-Pro",
        messages=HI,
        max_tokens=8,
        logit_bias={"300": 100},
        logprobs=True,
        stream=stream,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
    )
    if stream:
        tokens = [
            e.token
            for c in reply
            if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content
        ]
    else:
        tokens = [e.token for e in reply.choices[0].logprobs.content]
    assert tokens == ["token_id:300"] * 8


# Usage details and sampling defaults


@pytest.mark.parametrize("stream", [False, True])
def test_cached_tokens_on_a_repeated_long_prompt(client, stream):
    long = [
        {"role": "system", "content": f"Rules {stream}: " + "be brief and polite. " * 60},
        {"role": "user", "content": "Hello"},
    ]
    usages = []
    for _ in range(2):
        reply = client.chat.completions.create(
            model="ServiceAi-Fast",
            messages=long,
            max_tokens=2,
            stream=stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )
        usages.append([c for c in reply][-1].usage if stream else reply.usage)
    assert usages[0].prompt_tokens > 200
    assert usages[1].prompt_tokens_details.cached_tokens > 0


def test_generation_config_defaults_apply_when_sampling_fields_are_omitted(client):
    """The tiny model's generation_config.json sets top_k 5: each sampled token ranks in the top 5.

    vLLM lists the sampled token first in top_logprobs, then the most likely ones; its rank is
    one more than the number of listed tokens more likely than it. Sent explicitly, top_k -1 (no
    limit) lets lower-ranked tokens through.
    """

    def ranks(**fields) -> list[int]:
        response = client.chat.completions.create(
            model="ServiceAi-Fast",
            messages=HI,
            max_tokens=40,
            logprobs=True,
            top_logprobs=20,
            extra_body={"ignore_eos": True, **fields},
        )
        return [
            1 + sum(t.logprob > entry.logprob for t in entry.top_logprobs)
            for entry in response.choices[0].logprobs.content
        ]

    assert max(ranks()) <= 5
    assert max(ranks(top_k=-1, temperature=1.0)) > 5


def test_vllm_sampling_extras_are_accepted(client):
    response = client.chat.completions.create(
        model="ServiceAi-Fast",
        messages=HI,
        max_tokens=6,
        extra_body={
            "top_k": 3,
            "min_p": 0.01,
            "repetition_penalty": 1.1,
            "min_tokens": 6,
            "ignore_eos": True,
            "chat_template_kwargs": {},
        },
    )
    assert response.usage.completion_tokens == 6


# Content parts and fields that cannot be honoured


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ],
)
def test_non_text_parts_are_400_saying_text_only(client, part):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="ServiceAi-Fast",
            max_tokens=2,
            messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, part]}],
        )
    error = info.value.body
    assert error["param"] == "messages[0].content"
    assert "text only" in error["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("prediction", {"type": "content", "content": "x"}),
        ("store", True),
        ("web_search_options", {}),
        ("no_such_field", 1),
    ],
)
def test_fields_that_cannot_be_honoured_are_400_naming_them(http, field, value):
    response = http.post(
        "/v1/chat/completions", json={"model": "ServiceAi-Fast", "messages": HI, field: value}
    )
    assert error_of(response, 400)["param"] == field


def test_best_of_is_served_equal_to_n_and_refused_otherwise(http):
    """vLLM 0.32 has no best-of selection: it would return n choices and drop best_of."""
    body = {"model": "ServiceAi-Fast", "prompt": "hi", "max_tokens": 2}
    assert (
        error_of(http.post("/v1/completions", json={**body, "best_of": 3}), 400)["param"]
        == "best_of"
    )
    served = http.post("/v1/completions", json={**body, "n": 2, "best_of": 2})
    assert served.status_code == 200 and len(served.json()["choices"]) == 2


def test_caller_fields_are_accepted(client):
    response = client.chat.completions.create(
        model="ServiceAi-Fast",
        messages=HI,
        max_tokens=2,
        user="u-1",
        metadata={"team": "a"},
        store=False,
        service_tier="auto",
    )
    assert response.choices


# /v1/completions and /v1/models


def test_completions_whole_with_usage(client, tokenizer):
    response = client.completions.create(
        model="ServiceAi-Fast",
        prompt="Once upon a time",
        max_tokens=7,
        extra_body={"ignore_eos": True},
    )
    assert response.object == "text_completion" and response.model == "ServiceAi-Fast"
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 7
    assert response.usage.prompt_tokens == len(tokenizer.encode("Once upon a time"))


def test_completions_streamed_with_usage(client):
    chunks = list(
        client.completions.create(
            model="ServiceAi-Coder",
            prompt="def add(a, b):",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_a_reply_larger_than_the_plan_is_refused_before_counting(stack):
    """Free plan on Pro: 20000 tokens a minute. Two prompts x 8 choices x 2000 tokens can never
    fit: 429 with x-should-retry false, and the request is not counted."""
    from tests.e2e.test_limits import new_user

    _, key = new_user(stack, "free")
    with httpx.Client(
        base_url=stack.origin, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as http:
        response = http.post(
            "/v1/completions",
            json={
                "model": "ServiceAi-Pro",
                "prompt": ["a", "b"],
                "n": 8,
                "max_tokens": 2000,
            },
        )
        error = error_of(response, 429)
        assert response.headers["x-should-retry"] == "false"
        assert "retry-after" not in response.headers
        assert error["param"] == "max_tokens" and "20000" in error["message"]
        served = http.post(
            "/v1/completions",
            json={"model": "ServiceAi-Pro", "prompt": "a", "max_tokens": 2, "ignore_eos": True},
        )
        assert served.status_code == 200
        limit = int(served.headers["x-ratelimit-limit-requests"])
        assert served.headers["x-ratelimit-remaining-requests"] == str(limit - 1)
        assert served.json()["usage"]["completion_tokens"] == 2


def test_models_carry_max_model_len(client, http):
    assert {m.id: m.max_model_len for m in client.models.list()} == {
        "ServiceAi-Fast": 2048,
        "ServiceAi-Pro": 2048,
        "ServiceAi-Coder": 2048,
        "ServiceAi-Embed": 2048,  # its longest input
    }
    assert http.get("/v1/models/ServiceAi-Pro").json()["max_model_len"] == 2048


def test_max_tokens_beyond_the_context_is_400_not_429(http):
    """Pro's plan allows 20000 tokens a minute; 100000 is refused for the context first."""
    for path, body in (
        ("/v1/chat/completions", {"messages": HI}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        response = http.post(path, json={"model": "ServiceAi-Pro", "max_tokens": 100000, **body})
        error = error_of(response, 400)
        assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
