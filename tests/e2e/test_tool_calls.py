"""Forced tool calls always parse: `tool_choice` required or a named function gives a call whose
arguments are JSON valid against the function's schema, whole and streamed, on chat and on
/v1/responses, on a type with a tool-call parser and on one without.

The tiny model's weights are random, the harshest client of constrained decoding: no logit
bias steers it, and each case runs with 20 seeds. Its JSON must also be compact: the grammar
leaves no room for free whitespace.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from tests.conftest import error_of

SEEDS = range(20)
HI = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
        "unit": {"type": "string", "enum": ["C", "F"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "alerts": {"type": "boolean"},
    },
    "required": ["city", "unit", "days", "alerts"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
FUNCTIONS = {"get_weather": WEATHER, "get_time": TIME}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": schema}}
    for name, schema in FUNCTIONS.items()
]
RESPONSES_TOOLS = [
    {"type": "function", "name": name, "parameters": schema} for name, schema in FUNCTIONS.items()
]
TYPES = ["ServiceAi-Fast", "ServiceAi-Coder"]  # hermes parser; no parser
# OpenAI's finish_reason: "tool_calls" when the model must call, "stop" for a named function.
CHOICES = {
    "required": ("required", "tool_calls"),
    "named": ({"type": "function", "function": {"name": "get_weather"}}, "stop"),
}
MAX_TOKENS = 400  # more than the schemas need: a forced call must end well before it


def compact(text: str) -> bool:
    """No whitespace outside JSON strings."""
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char.isspace():
            return False
    return True


def assert_call(name: str, arguments: str) -> None:
    assert name in FUNCTIONS, name
    jsonschema.validate(json.loads(arguments), FUNCTIONS[name])
    assert compact(arguments), arguments


async def chat_call(
    client: openai.AsyncOpenAI,
    model: str,
    choice: object,
    seed: int,
    stream: bool,
    max_tokens: int = MAX_TOKENS,
) -> tuple[str, list[tuple[str, str]]]:
    """(finish_reason, [(name, arguments)]) of one forced chat call."""
    request = dict(
        model=model,
        messages=HI,
        tools=CHAT_TOOLS,
        tool_choice=choice,
        max_tokens=max_tokens,
        seed=seed,
        temperature=1.0,
    )
    if not stream:
        [choice_] = (await client.chat.completions.create(**request)).choices
        calls = [(c.function.name, c.function.arguments) for c in choice_.message.tool_calls or ()]
        return choice_.finish_reason, calls
    calls: dict[int, list[str]] = {}
    finish = None
    async for chunk in await client.chat.completions.create(**request, stream=True):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or ():
            call = calls.setdefault(delta.index, ["", ""])
            if delta.function:
                call[0] += delta.function.name or ""
                call[1] += delta.function.arguments or ""
    return finish, [(name, arguments) for name, arguments in calls.values()]


@pytest.mark.parametrize("model", TYPES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", CHOICES, ids=list(CHOICES))
async def test_a_forced_chat_call_parses_against_its_schema(async_client, model, stream, choice):
    tool_choice, finish_reason = CHOICES[choice]
    replies = await asyncio.gather(
        *(chat_call(async_client, model, tool_choice, seed, stream) for seed in SEEDS)
    )
    for finish, calls in replies:
        assert finish == finish_reason
        assert calls
        for name, arguments in calls:
            assert_call(name, arguments)
        if choice == "named":
            assert [name for name, _ in calls] == ["get_weather"]


def test_parallel_tool_calls_false_makes_one_call(client):
    for seed in range(5):
        [choice] = client.chat.completions.create(
            model="ServiceAi-Fast",
            messages=HI,
            tools=CHAT_TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=MAX_TOKENS,
            seed=seed,
        ).choices
        [call] = choice.message.tool_calls
        assert_call(call.function.name, call.function.arguments)


async def responses_call(
    client: openai.AsyncOpenAI, model: str, choice: object, seed: int, stream: bool
) -> list[tuple[str, str]]:
    """[(name, arguments)] of the function_call items of one forced response."""
    request = dict(
        model=model,
        input="What is the weather in Paris?",
        tools=RESPONSES_TOOLS,
        tool_choice=choice,
        max_output_tokens=MAX_TOKENS,
        extra_body={"seed": seed},
        store=False,
    )
    if stream:
        async with client.responses.stream(**request) as events:
            response = await events.get_final_response()
    else:
        response = await client.responses.create(**request)
    assert response.status == "completed"
    return [(item.name, item.arguments) for item in response.output if item.type == "function_call"]


@pytest.mark.parametrize("model", TYPES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", "named"])
async def test_a_forced_responses_call_parses_against_its_schema(
    async_client, model, stream, choice
):
    tool_choice = (
        "required" if choice == "required" else {"type": "function", "name": "get_weather"}
    )
    replies = await asyncio.gather(
        *(responses_call(async_client, model, tool_choice, seed, stream) for seed in SEEDS)
    )
    for calls in replies:
        assert calls
        for name, arguments in calls:
            assert_call(name, arguments)
        if choice == "named":
            assert [name for name, _ in calls] == ["get_weather"]


@pytest.mark.parametrize("model", TYPES)
@pytest.mark.parametrize("choice", CHOICES, ids=list(CHOICES))
async def test_a_forced_chat_call_cut_by_the_length_limit_is_no_call(async_client, model, choice):
    """As OpenAI answers (and vLLM's own test_max_tokens_with_tool_choice_required): a whole
    reply ends 'length' with no tool_calls and empty content; a stream ends 'length' (what it
    sent of the call's arguments before the cut has gone out)."""
    request = dict(
        model=model,
        messages=HI,
        tools=CHAT_TOOLS,
        tool_choice=CHOICES[choice][0],
        max_completion_tokens=1,
    )
    [whole] = (await async_client.chat.completions.create(**request)).choices
    assert whole.finish_reason == "length"
    assert not whole.message.tool_calls and whole.message.content == ""
    finish, _ = await chat_call(async_client, model, CHOICES[choice][0], 0, True, max_tokens=1)
    assert finish == "length"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", "named"])
async def test_a_forced_responses_call_cut_by_the_length_limit_is_incomplete_with_no_call(
    async_client, stream, choice
):
    tool_choice = (
        "required" if choice == "required" else {"type": "function", "name": "get_weather"}
    )
    request = dict(
        model="ServiceAi-Fast",
        input="What is the weather in Paris?",
        tools=RESPONSES_TOOLS,
        tool_choice=tool_choice,
        max_output_tokens=1,
        store=False,
    )
    if stream:
        async with async_client.responses.stream(**request) as events:
            response = await events.get_final_response()
    else:
        response = await async_client.responses.create(**request)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in response.output if item.type == "function_call"] == []


@pytest.mark.parametrize("tool_choice", ["auto", None])
def test_an_automatic_choice_on_a_type_without_a_parser_is_400(http, tool_choice):
    body = {"model": "ServiceAi-Coder", "messages": HI, "tools": CHAT_TOOLS}
    if tool_choice:
        body["tool_choice"] = tool_choice
    error = error_of(http.post("/v1/chat/completions", json=body), 400)
    assert error["param"] == "tool_choice" and "no tool-call parser" in error["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_json_response_formats_are_compact(client, stream):
    """Constrained JSON never pads with whitespace: response_format and text.format alike."""
    formats = [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}},
    ]
    for response_format in formats:
        for seed in range(5):
            request = dict(
                model="ServiceAi-Fast",
                messages=HI,
                max_tokens=MAX_TOKENS,
                seed=seed,
                response_format=response_format,
            )
            if stream:
                text = "".join(
                    c.choices[0].delta.content or ""
                    for c in client.chat.completions.create(**request, stream=True)
                    if c.choices
                )
            else:
                text = client.chat.completions.create(**request).choices[0].message.content
            if response_format["type"] == "json_schema":
                jsonschema.validate(json.loads(text), WEATHER)
            assert compact(text), text
    for seed in range(5):
        reply = client.responses.create(
            model="ServiceAi-Fast",
            input="weather?",
            max_output_tokens=MAX_TOKENS,
            store=False,
            text={"format": {"type": "json_schema", "name": "w", "schema": WEATHER}},
            extra_body={"seed": seed},
        )
        jsonschema.validate(json.loads(reply.output_text), WEATHER)
        assert compact(reply.output_text), reply.output_text
