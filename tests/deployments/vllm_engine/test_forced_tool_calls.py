"""Forced tool calls take vLLM's JSON-schema path; automatic ones keep the parser's structural
tag, with whitespace bounded. vLLM's own parser adjusts the requests here; the engine generates
for real in tests/e2e/test_tool_calls.py."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.parser.parser_manager import ParserManager

from deployments.model_type import tiny_model_dir
from deployments.tiny_model import ensure
from deployments.vllm_engine.forced_tool_calls import FORCED_ONLY, bounded_whitespace, install

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": WEATHER}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(ensure(tiny_model_dir()))


def parser_for(name: str | None, tokenizer):
    served = install(name)
    parser = ParserManager.get_parser(
        tool_parser_name=served, enable_auto_tools=True, tool_strict_level="parameter"
    )
    return parser(tokenizer, [])


def chat(tool_choice, **fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_TOOL],
            "tool_choice": tool_choice,
            **fields,
        }
    )


@pytest.mark.parametrize("name", ["hermes", None])
def test_a_named_function_is_constrained_to_its_parameters_as_json(name, tokenizer):
    request = parser_for(name, tokenizer).adjust_request(
        chat({"type": "function", "function": {"name": "get_weather"}})
    )
    assert request.structured_outputs.structural_tag is None
    assert request.structured_outputs.json == WEATHER


@pytest.mark.parametrize("parallel", [None, False])
def test_required_is_an_array_of_calls_of_the_given_functions(parallel, tokenizer):
    fields = {} if parallel is None else {"parallel_tool_calls": parallel}
    request = parser_for("hermes", tokenizer).adjust_request(chat("required", **fields))
    schema = request.structured_outputs.json
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert schema.get("maxItems") == (1 if parallel is False else None)
    [function] = schema["items"]["anyOf"]
    assert function["properties"]["name"]["enum"] == ["get_weather"]
    assert function["properties"]["parameters"] == WEATHER


def test_a_forced_call_on_responses_takes_the_same_path(tokenizer):
    request = ResponsesRequest.model_validate(
        {
            "model": "m",
            "input": "hi",
            "tools": [RESPONSES_TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
        }
    )
    request = parser_for("hermes", tokenizer).adjust_request(request)
    assert request.text.format.type == "json_schema"
    assert request.text.format.schema_ == WEATHER


def test_an_automatic_call_keeps_the_parsers_tag_with_whitespace_bounded(tokenizer):
    request = parser_for("hermes", tokenizer).adjust_request(chat("auto"))
    tag = request.structured_outputs.structural_tag
    assert tag is not None and '"max_whitespace_cnt": 1' in tag


def test_bounding_whitespace_leaves_the_clients_schema_as_it_was():
    schema = {"type": "object", "properties": {"type": {"type": "string", "enum": ["json_schema"]}}}
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "or",
            "elements": [
                {"type": "json_schema", "json_schema": schema},
                {
                    "type": "sequence",
                    "elements": [
                        {"type": "const_string", "value": "x"},
                        {"type": "json_schema", "json_schema": {}},
                    ],
                },
            ],
        },
    }
    bounded = json.loads(bounded_whitespace(json.dumps(tag)))
    first, sequence = bounded["format"]["elements"]
    assert first["max_whitespace_cnt"] == 1 and first["json_schema"] == schema
    assert sequence["elements"][1]["max_whitespace_cnt"] == 1


def test_a_type_without_a_parser_gets_one_for_forced_calls_only(tokenizer):
    assert install(None) == FORCED_ONLY
    parser = parser_for(None, tokenizer)
    # Free text holds no call it can recognise: an automatic choice is the gateway's 400.
    assert parser.extract_tool_calls('{"name": "get_weather"}', chat("auto")).tool_calls == []


def test_whole_arguments_come_back_compact_and_valid_json():
    from deployments.vllm_engine.completions import compact_json

    assert compact_json('{"city": "Paris", "days": [1, 2]}') == '{"city":"Paris","days":[1,2]}'
    # A raw control character in a string is not JSON; escaped, it is.
    assert compact_json('{"city":"P\x06"}') == '{"city":"P\\u0006"}'
    assert compact_json('{"city":"Pa') == '{"city":"Pa'  # cut by max_tokens: as it came


@pytest.mark.parametrize("finish_reason, calls", [("length", 0), ("stop", 1)])
def test_a_forced_call_cut_short_by_the_length_limit_is_no_call(finish_reason, calls):
    from vllm.entrypoints.generate.base.protocol import FunctionCall, ToolCall
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    from deployments.vllm_engine.completions import ChatApi

    class Serving:
        create_chat_completion = None

    call = ToolCall(function=FunctionCall(name="get_weather", arguments='{"city": "Rome"}'))
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = ChatCompletionResponse(
        model="m",
        usage=UsageInfo(prompt_tokens=1, completion_tokens=1, total_tokens=2),
        choices=[
            ChatCompletionResponseChoice(index=0, message=message, finish_reason=finish_reason)
        ],
    )
    named = chat({"type": "function", "function": {"name": "get_weather"}})
    [choice] = json.loads(ChatApi(Serving()).body(result, named))["choices"]
    assert choice["finish_reason"] == finish_reason
    assert len(choice["message"].get("tool_calls") or []) == calls
    assert choice["message"]["content"] == ""
