import pytest
from pydantic import ValidationError

from app.apis.chat.protocol import ChatCompletionRequest
from app.apis.completions.protocol import CompletionRequest


def request(**fields):
    return ChatCompletionRequest.model_validate(
        {"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_the_engine_gets_the_body_as_sent_less_caller_fields():
    body = request(temperature=0.3, top_k=5, user="u1", metadata={"a": "b"}, store=False)
    assert body.unsupported_field() is None
    assert body.to_engine() == {
        "model": "ServiceAi-Fast",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.3,
        "top_k": 5,
    }


def test_max_completion_tokens_wins_over_max_tokens():
    assert request(max_tokens=5, max_completion_tokens=9).reply_limit == 9


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"store": True}, "store"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"functions": []}, "functions"),
        ({"made_up": 1}, "made_up"),
    ],
)
def test_fields_that_cannot_be_honoured_are_named(fields, param):
    assert request(**fields).unsupported_field()[0] == param


def test_the_agent_loop_turn_is_accepted():
    body = ChatCompletionRequest.model_validate(
        {
            "model": "ServiceAi-Fast",
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
            "tool_choice": "auto",
        }
    )
    assert body.unsupported_field() is None


def test_image_parts_are_refused_as_text_only():
    with pytest.raises(ValidationError) as info:
        request(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                    ],
                }
            ]
        )
    error = info.value.errors()[0]
    assert error["loc"][:3] == ("messages", 0, "content")
    assert "text only" in error["msg"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "0.5"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"stop": [str(i) for i in range(5)]}, "stop"),
        ({"stop_token_ids": list(range(5))}, "stop_token_ids"),
        ({"bad_words": ["x"] * 129}, "bad_words"),
        ({"allowed_token_ids": list(range(301))}, "allowed_token_ids"),
        ({"stop": [""]}, "stop"),
        ({"n": 0}, "n"),
        ({"n": 99}, "n"),
        ({"stream": "true"}, "stream"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"min_tokens": 2**31}, "min_tokens"),
        ({"max_tokens": 10**30}, "max_tokens"),
        ({"max_completion_tokens": 2**31}, "max_completion_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("inf")}, "top_p"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages"),
        ({"model": "x" * 300}, "model"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": None}]}, "messages"),
    ],
)
def test_out_of_range_or_mistyped_values_are_refused(fields, param):
    with pytest.raises(ValidationError) as info:
        request(**fields)
    assert info.value.errors()[0]["loc"][0] == param


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"n": 2}, True),
        ({"n": 2, "best_of": 2}, True),
        ({"n": 2, "stream": False}, False),
        ({"n": 1}, False),
        ({"n": 2, "logprobs": None}, False),
        ({"n": 2, "echo": False}, False),
    ],
)
def test_an_echoed_stream_of_several_choices_with_logprobs_is_refused(fields, refused):
    """vLLM's completion stream fails on it (a 5xx mid-stream): refused up front instead."""
    body = CompletionRequest.model_validate(
        {
            "model": "ServiceAi-Fast",
            "prompt": "hi",
            "echo": True,
            "logprobs": 2,
            "stream": True,
            **fields,
        }
    )
    assert (body.unsupported_field() is not None) == refused
    if refused:
        assert body.unsupported_field()[0] == "echo"


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"best_of": 3}, True),
        ({"n": 2, "best_of": 3}, True),
        ({"n": 3, "best_of": 2}, True),
        ({"best_of": 1}, False),
        ({"n": 2, "best_of": 2}, False),
        ({"n": 2}, False),
    ],
)
def test_best_of_other_than_n_is_refused_and_never_reaches_the_engine(fields, refused):
    """vLLM 0.32 has no best_of: it would return n and ignore the field."""
    body = CompletionRequest.model_validate({"model": "ServiceAi-Fast", "prompt": "hi", **fields})
    refusal = body.unsupported_field()
    assert (refusal is not None and refusal[0] == "best_of") == refused
    if not refused:
        assert "best_of" not in body.to_engine()


GRAMMARS = [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"structured_outputs": {"regex": "[ab]+"}},
    {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
    {
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    },
]
MASKS = [{"allowed_token_ids": [5, 6]}, {"bad_words": ["x"]}, {"min_tokens": 3}]


@pytest.mark.parametrize("grammar", GRAMMARS)
@pytest.mark.parametrize("mask", MASKS)
def test_a_token_mask_on_a_grammar_is_refused_by_name(grammar, mask):
    """Together they can leave no token the grammar accepts, and vLLM fails the request in
    its engine; each alone is served."""
    assert request(**grammar, **mask).unsupported_field()[0] == next(iter(mask))
    assert request(**grammar).unsupported_field() is None
    assert request(**mask).unsupported_field() is None
    assert (
        request(
            **mask, tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto"
        ).unsupported_field()
        is None
    )
