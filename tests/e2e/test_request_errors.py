"""Every request a client can get wrong: status, OpenAI envelope, and the param it names."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import error_of

OK_MESSAGES = [{"role": "user", "content": "hi"}]


def post(http, body=None, **kwargs):
    return http.post("/v1/chat/completions", json=body, **kwargs)


def test_malformed_json(http):
    error = error_of(
        http.post(
            "/v1/chat/completions",
            content=b'{"model": "ServiceAi-Fast", "messages": [',
            headers={"Content-Type": "application/json"},
        ),
        400,
    )
    assert error["type"] == "invalid_request_error" and "JSON" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "ServiceAi-Fast"}, "messages"),
        ({"messages": OK_MESSAGES}, "model"),
        ({"model": "ServiceAi-Fast", "messages": []}, "messages"),
        (
            {"model": "ServiceAi-Fast", "messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role",
        ),
        (
            {"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
        ),
        ({"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "temperature": 2.1}, "temperature"),
        ({"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "temperature": "hot"}, "temperature"),
        ({"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "top_p": 0}, "top_p"),
        ({"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "max_tokens": 0}, "max_tokens"),
        (
            {"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "max_completion_tokens": -1},
            "max_completion_tokens",
        ),
        (
            {"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "frequency_penalty": -2.5},
            "frequency_penalty",
        ),
        (
            {"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "presence_penalty": 9},
            "presence_penalty",
        ),
        (
            {
                "model": "ServiceAi-Fast",
                "messages": OK_MESSAGES,
                "stop": [str(i) for i in range(5)],
            },
            "stop",
        ),
        ({"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "n": 0}, "n"),
        ({"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "stream": "yes"}, "stream"),
        (
            {
                "model": "ServiceAi-Fast",
                "messages": OK_MESSAGES,
                "stream_options": {"include_usage": 1},
            },
            "stream_options.include_usage",
        ),
    ],
)
def test_invalid_fields_are_400_naming_the_param(http, body, param):
    error = error_of(post(http, body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param.split("[")[0].split(".")[0] in error["message"]


def test_unknown_model_is_404_listing_valid_ids(http):
    error = error_of(post(http, {"model": "gpt-4o", "messages": OK_MESSAGES}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    for name in ("ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder"):
        assert name in error["message"]


def test_unknown_model_through_the_client(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="ServiceAi-Turbo", messages=OK_MESSAGES)


def test_prompt_longer_than_the_context(http):
    long_text = "The quick brown fox jumps over the lazy dog. " * 400
    for stream in (False, True):
        error = error_of(
            post(
                http,
                {
                    "model": "ServiceAi-Fast",
                    "stream": stream,
                    "messages": [{"role": "user", "content": long_text}],
                },
            ),
            400,
        )
        assert error["code"] == "context_length_exceeded"
        assert "maximum context length is 2048 tokens" in error["message"]


def test_max_tokens_beyond_the_context(http):
    error = error_of(
        post(http, {"model": "ServiceAi-Pro", "messages": OK_MESSAGES, "max_tokens": 5000}), 400
    )
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert "max_tokens is too large: 5000" in error["message"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer wrong-key"},
    ],
)
def test_bad_or_missing_key_is_401(stack, headers):
    import httpx

    response = httpx.post(
        f"{stack.base_url}/chat/completions",
        json={"model": "ServiceAi-Fast", "messages": OK_MESSAGES},
        headers=headers,
    )
    error = error_of(response, 401)
    assert error["code"] == "invalid_api_key"
    assert "wrong-key" not in error["message"]


def test_bad_key_through_the_client(stack):
    bad = openai.OpenAI(base_url=stack.base_url, api_key="sai-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="ServiceAi-Fast", messages=OK_MESSAGES)


def test_unknown_route_is_an_envelope(http):
    error = error_of(http.get("/v1/completions/legacy"), 404)
    assert error["code"] == "unknown_url"
