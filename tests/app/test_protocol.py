import pytest
from pydantic import ValidationError

from app.protocol import ChatCompletionRequest
from deployments.generation import SamplingOptions


def request(**fields):
    return ChatCompletionRequest.model_validate(
        {"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_defaults_follow_openai():
    generation = request().to_generation("chatcmpl-1")
    assert generation.request_id == "chatcmpl-1"
    assert generation.messages == (("user", "hi"),)
    assert generation.sampling == SamplingOptions(
        max_tokens=None, temperature=1.0, top_p=1.0, n=1, stop=()
    )


def test_text_parts_are_joined_and_developer_is_system():
    generation = ChatCompletionRequest.model_validate(
        {
            "model": "ServiceAi-Pro",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]},
                {"role": "assistant", "content": "Hi."},
            ],
        }
    ).to_generation("x")
    assert generation.messages == (("system", "Be brief."), ("user", "Hello, world"), ("assistant", "Hi."))


def test_sampling_fields_are_mapped():
    sampling = request(
        temperature=0.3, top_p=0.9, max_tokens=7, frequency_penalty=-1, presence_penalty=2,
        stop="END", seed=42, n=2, ignore_eos=True, min_tokens=3,
    ).to_generation("x").sampling
    assert sampling == SamplingOptions(
        max_tokens=7, temperature=0.3, top_p=0.9, frequency_penalty=-1.0, presence_penalty=2.0,
        stop=("END",), seed=42, n=2, ignore_eos=True, min_tokens=3,
    )


def test_max_completion_tokens_wins_over_max_tokens():
    assert request(max_tokens=5, max_completion_tokens=9).to_generation("x").sampling.max_tokens == 9


def test_unknown_fields_are_ignored():
    assert request(logit_bias={"1": 2}, response_format={"type": "text"}, tools=[]).model == "ServiceAi-Fast"


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
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
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
    ],
)
def test_out_of_range_or_mistyped_values_are_refused(fields, param):
    with pytest.raises(ValidationError) as info:
        request(**fields)
    assert info.value.errors()[0]["loc"][0] == param
