"""Hand-made hostile requests against the real stack (HAProxy, ingress, vLLM): each one gets a
clear answer (an error in the envelope naming the field or the limit, never a 5xx), and the
service keeps serving afterwards."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from app.http.body_limit import DEFAULT_MAX_BODY_BYTES
from tests.conftest import error_of

OK_MESSAGES = [{"role": "user", "content": "hi"}]
FAST = {"model": "ServiceAi-Fast", "messages": OK_MESSAGES, "max_tokens": 2}
# What a leaked stack trace or source location looks like in a response.
INTERNALS = re.compile(r'Traceback|File "|\.py\b|/work/|site-packages|/tmp/')


def raw(http: httpx.Client, body: bytes, **headers: str) -> httpx.Response:
    return http.post(
        "/v1/chat/completions",
        content=body,
        headers={"Content-Type": "application/json", **headers},
    )


def clean_error(response: httpx.Response, status: int) -> dict:
    error = error_of(response, status)
    assert not INTERNALS.search(response.text), response.text[:500]
    return error


def test_body_over_the_limit_is_413(http):
    body = json.dumps({**FAST, "padding": "x" * DEFAULT_MAX_BODY_BYTES}).encode()
    error = clean_error(raw(http, body), 413)
    assert error["code"] == "request_too_large" and str(DEFAULT_MAX_BODY_BYTES) in error["message"]


def test_chunked_body_over_the_limit_is_413(http):
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": "'
        for _ in range(2 * DEFAULT_MAX_BODY_BYTES // 65536):
            yield b"x" * 65536
        yield b'"}]}'

    response = http.post(
        "/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert clean_error(response, 413)["code"] == "request_too_large"


def test_every_early_answer_arrives_whole(http):
    # An answer sent before the body is read used to close the connection on unread bytes,
    # and the reset made HAProxy cut 5-10% of them off (`serviceai run`, two clients). Not
    # certain to catch that here (it passed twice on an idle machine); the exchange itself is
    # pinned in tests/app/http/test_body_limit.py.
    declared = json.dumps({**FAST, "padding": "x" * DEFAULT_MAX_BODY_BYTES}).encode()
    stranger = json.dumps({**FAST, "padding": "x" * (DEFAULT_MAX_BODY_BYTES // 2)}).encode()

    def chunks() -> Iterator[bytes]:
        for _ in range(2 * DEFAULT_MAX_BODY_BYTES // 65536):
            yield b"x" * 65536

    def send(i: int) -> str:
        kind = i % 3
        if kind == 2:
            response = raw(http, stranger, Authorization="Bearer sai-" + "s" * 43)
            return clean_error(response, 401)["code"]
        response = http.post(
            "/v1/chat/completions",
            content=declared if kind == 0 else chunks(),
            headers={"Content-Type": "application/json"},
        )
        return clean_error(response, 413)["code"]

    with ThreadPoolExecutor(3) as pool:
        codes = list(pool.map(send, range(120)))
    assert codes == ["request_too_large", "request_too_large", "invalid_api_key"] * 40


def test_deeply_nested_json(http):
    for depth in (1_000, 100_000):
        body = b'{"model": "ServiceAi-Fast", "messages": %s, "extra": %s%s}' % (
            json.dumps(OK_MESSAGES).encode(),
            b"[" * depth,
            b"]" * depth,
        )
        clean_error(raw(http, body), 400)
        nested = b'{"model": "ServiceAi-Fast", "messages": [%s%s]}' % (
            b'{"a":' * depth,
            b"}" * depth,
        )
        clean_error(raw(http, nested), 400)


def test_invalid_utf8(http):
    body = (
        b'{"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": "\xff\xfe\xc3("}]}'
    )
    assert "JSON" in clean_error(raw(http, body), 400)["message"]


@pytest.mark.parametrize(
    ("field", "literal"),
    [
        ("temperature", "NaN"),
        ("top_p", "Infinity"),
        ("presence_penalty", "-Infinity"),
        ("frequency_penalty", "NaN"),
    ],
)
def test_nan_and_infinity(http, field, literal):
    body = (
        b'{"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": "hi"}], "%s": %s}'
        % (field.encode(), literal.encode())
    )
    assert clean_error(raw(http, body), 400)["param"] == field


@pytest.mark.parametrize(
    "field", ["max_tokens", "max_completion_tokens", "seed", "n", "min_tokens"]
)
def test_huge_integers(http, field):
    for value in (10**30, -(10**30), 2**63, -(2**63) - 1):
        error = clean_error(http.post("/v1/chat/completions", json={**FAST, field: value}), 400)
        assert error["param"] == field


def test_seeds_at_the_edges_of_64_bits(http):
    for seed in (2**63 - 1, -(2**63), 0):
        assert http.post("/v1/chat/completions", json={**FAST, "seed": seed}).status_code == 200


def test_ten_thousand_messages(http):
    messages = [
        {"role": "user" if i % 2 else "assistant", "content": "hello there"} for i in range(10_000)
    ]
    error = clean_error(http.post("/v1/chat/completions", json={**FAST, "messages": messages}), 400)
    # Refused by the list's length (OpenAI's cap), before one message is validated.
    assert (error["code"], error["param"]) == ("invalid_value", "messages")
    assert "at most 2048 items" in error["message"]


def test_prompt_far_over_the_context(http):
    text = "The quick brown fox jumps over the lazy dog. " * (DEFAULT_MAX_BODY_BYTES // 60)
    for stream in (False, True):
        body = {**FAST, "stream": stream, "messages": [{"role": "user", "content": text}]}
        error = clean_error(http.post("/v1/chat/completions", json=body), 400)
        assert error["code"] == "context_length_exceeded"


def test_control_characters(http):
    text = "".join(chr(c) for c in range(32)) + "\u007f\u2028\u2029\ufeff\U0001f600"
    response = http.post(
        "/v1/chat/completions", json={**FAST, "messages": [{"role": "user", "content": text}]}
    )
    assert response.status_code == 200 and response.json()["choices"]
    # Unescaped control characters inside a JSON string are not JSON.
    clean_error(
        raw(
            http,
            b'{"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": "\x00\x01"}]}',
        ),
        400,
    )
    error = clean_error(
        http.post("/v1/chat/completions", json={**FAST, "model": "Fast\x00\n\x1b[31m"}), 404
    )
    assert error["param"] == "model"


def test_a_model_of_one_megabyte(http):
    response = http.post("/v1/chat/completions", json={**FAST, "model": "M" * 1_000_000})
    error = clean_error(response, 400)
    assert error["param"] == "model" and "256" in error["message"]
    assert len(response.content) < 2000  # the value is not echoed back


def test_header_names_of_odd_case(stack):
    response = httpx.post(
        f"{stack.base_url}/chat/completions",
        content=json.dumps(FAST),
        headers={"aUtHoRiZaTiOn": f"bEaReR {stack.api_key}", "CONTENT-TYPE": "Application/JSON"},
    )
    assert response.status_code == 200, response.text


def test_duplicated_headers(stack):
    def post(headers: list[tuple[str, str]]) -> httpx.Response:
        return httpx.post(
            f"{stack.base_url}/chat/completions", content=json.dumps(FAST), headers=headers
        )

    good = ("Authorization", f"Bearer {stack.api_key}")
    json_type = ("Content-Type", "application/json")
    # Which of two Authorization headers counts is ambiguous between proxies: both are refused.
    for second in (good, ("Authorization", "Bearer sai-" + "A" * 43), ("authorization", "Basic x")):
        for headers in ([good, second, json_type], [second, good, json_type]):
            error = clean_error(post(headers), 401)
            assert "more than one Authorization header" in error["message"]
    # A repeated Content-Type is harmless: the first one counts.
    assert post([good, json_type, ("Content-Type", "application/json")]).status_code == 200
    assert post([good, json_type, ("Content-Type", "text/plain")]).status_code == 200


def test_still_serving_after_all_that(client):
    reply = client.chat.completions.create(
        model="ServiceAi-Fast", messages=OK_MESSAGES, max_tokens=3
    )
    assert reply.choices[0].message.role == "assistant"
