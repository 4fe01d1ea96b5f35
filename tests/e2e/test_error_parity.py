"""The same fault gets the same answer on every API: status, `code`, `x-should-retry`, and a
`param` that names the field as that API calls it.

Chat, completions and responses go through one pipeline (app/serving/pipeline.py); this table
sends each fault to each API that can express it and compares what comes back.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from tests.conftest import Stack, error_of
from tests.e2e.conftest import serviceai_cli

CHAT, COMPLETION, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
FAR_BEYOND = "hello " * 6000  # thousands of tokens past the 2,048 of the context
TOOL_CHAT = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
TOOL_RESPONSES = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
# Issue 70's bombs: an enum the engine took seconds to compile, a regex it never finished.
ENUM_BOMB = {"type": "string", "enum": [f"v{i}" for i in range(30_000)]}
REGEX_BOMB = "((ab|a){1,300}c){1,300}"
MANY_STOPS = [f"stop{i}" for i in range(5)]


def bodies(model: str, **per_api: dict) -> dict[str, dict]:
    """One body per API: the common part, and what each API says its own way."""
    base = {
        CHAT: {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        COMPLETION: {"model": model, "prompt": "hi", "max_tokens": 4},
        RESPONSES: {"model": model, "input": "hi", "max_output_tokens": 4},
    }
    return {path: {**base[path], **fields} for path, fields in per_api.items()}


@dataclass(frozen=True)
class Fault:
    name: str
    requests: dict[str, dict]
    status: int
    code: str
    params: dict[str, str | None]


FAULTS = [
    Fault(
        "unknown model",
        bodies("ServiceAi-Nope", **{CHAT: {}, COMPLETION: {}, RESPONSES: {}}),
        404,
        "model_not_found",
        {CHAT: "model", COMPLETION: "model", RESPONSES: "model"},
    ),
    Fault(
        "a field the service does not know",
        bodies("ServiceAi-Fast", **{p: {"frobnicate": 1} for p in (CHAT, COMPLETION, RESPONSES)}),
        400,
        "unsupported_parameter",
        {CHAT: "frobnicate", COMPLETION: "frobnicate", RESPONSES: "frobnicate"},
    ),
    Fault(
        "a reply limit beyond the whole context (and beyond the plan's minute)",
        bodies(
            "ServiceAi-Pro",
            **{
                CHAT: {"max_tokens": 30_000},
                COMPLETION: {"max_tokens": 30_000},
                RESPONSES: {"max_output_tokens": 30_000},
            },
        ),
        400,
        "context_length_exceeded",
        {CHAT: "max_tokens", COMPLETION: "max_tokens", RESPONSES: "max_output_tokens"},
    ),
    Fault(
        "a prompt far beyond the context",
        bodies(
            "ServiceAi-Fast",
            **{
                CHAT: {"messages": [{"role": "user", "content": FAR_BEYOND}]},
                COMPLETION: {"prompt": FAR_BEYOND},
                RESPONSES: {"input": FAR_BEYOND},
            },
        ),
        400,
        "context_length_exceeded",
        {CHAT: "messages", COMPLETION: "prompt", RESPONSES: "input"},
    ),
    Fault(
        "a temperature out of range",
        bodies("ServiceAi-Fast", **{p: {"temperature": 3} for p in (CHAT, COMPLETION, RESPONSES)}),
        400,
        "invalid_value",
        {CHAT: "temperature", COMPLETION: "temperature", RESPONSES: "temperature"},
    ),
    Fault(
        "more tools than any API takes",
        bodies(
            "ServiceAi-Fast",
            **{CHAT: {"tools": TOOL_CHAT * 129}, RESPONSES: {"tools": TOOL_RESPONSES * 129}},
        ),
        400,
        "invalid_value",
        {CHAT: "tools", RESPONSES: "tools"},
    ),
    Fault(
        "more stop strings than any API takes",
        bodies("ServiceAi-Fast", **{p: {"stop": MANY_STOPS} for p in (CHAT, COMPLETION)}),
        400,
        "invalid_value",
        {CHAT: "stop", COMPLETION: "stop"},
    ),
    Fault(
        "an enum bomb in a JSON schema",
        bodies(
            "ServiceAi-Fast",
            **{
                CHAT: {
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "bomb", "schema": ENUM_BOMB},
                    }
                },
                COMPLETION: {"structured_outputs": {"json": ENUM_BOMB}},
                RESPONSES: {
                    "text": {"format": {"type": "json_schema", "name": "b", "schema": ENUM_BOMB}}
                },
            },
        ),
        400,
        "grammar_too_complex",
        {
            CHAT: "response_format.json_schema.schema",
            COMPLETION: "structured_outputs.json",
            RESPONSES: "text.format.schema",
        },
    ),
    Fault(
        "a regex bomb",
        bodies(
            "ServiceAi-Fast",
            **{p: {"structured_outputs": {"regex": REGEX_BOMB}} for p in (CHAT, COMPLETION)},
        ),
        400,
        "grammar_too_complex",
        {CHAT: "structured_outputs.regex", COMPLETION: "structured_outputs.regex"},
    ),
    Fault(
        "tools on a type without a tool-call parser",
        bodies(
            "ServiceAi-Coder", **{CHAT: {"tools": TOOL_CHAT}, RESPONSES: {"tools": TOOL_RESPONSES}}
        ),
        400,
        "unsupported_parameter",
        {CHAT: "tool_choice", RESPONSES: "tool_choice"},
    ),
]


MESSAGES = "/v1/messages"
ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error"}
MESSAGE_FAULTS = {
    "unknown model": {"model": "ServiceAi-Nope"},
    "a field the service does not know": {"frobnicate": 1},
    "a reply limit beyond the whole context (and beyond the plan's minute)": {
        "model": "ServiceAi-Pro",
        "max_tokens": 30_000,
    },
    "a prompt far beyond the context": {"messages": [{"role": "user", "content": FAR_BEYOND}]},
    "a temperature out of range": {"temperature": 3},
    "tools on a type without a tool-call parser": {
        "model": "ServiceAi-Coder",
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    },
    "more tools than any API takes": {
        "tools": [{"name": "f", "input_schema": {"type": "object"}}] * 129
    },
    "more stop strings than any API takes": {"stop_sequences": MANY_STOPS},
    "an enum bomb in a JSON schema": {
        "output_config": {"format": {"type": "json_schema", "schema": ENUM_BOMB}}
    },
}
"""The same faults as Anthropic's clients send them to /v1/messages."""


ON_MESSAGES = [f for f in FAULTS if f.name in MESSAGE_FAULTS]  # a regex has no field there


@pytest.mark.parametrize("fault", ON_MESSAGES, ids=[f.name for f in ON_MESSAGES])
def test_each_fault_gets_the_same_status_and_meaning_on_the_messages_api(http, fault):
    body = {"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": "hi"}]}
    response = http.post(MESSAGES, json={**body, "max_tokens": 4, **MESSAGE_FAULTS[fault.name]})
    assert response.status_code == fault.status, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == ANTHROPIC_TYPES[fault.status]
    # The message names the field as Anthropic calls it (messages, max_tokens, tool_choice...).
    openai_param = next(iter(fault.params.values()))
    named = {
        "prompt": "messages",
        "input": "messages",
        "max_output_tokens": "max_tokens",
        "stop": "stop_sequences",
        "response_format.json_schema.schema": "output_config.format.schema",
    }
    assert named.get(openai_param, openai_param) in error["error"]["message"]


def answers(http: httpx.Client, fault: Fault) -> dict[str, tuple]:
    found = {}
    for path, body in fault.requests.items():
        response = http.post(path, json=body)
        error = error_of(response, response.status_code)
        found[path] = (
            response.status_code,
            error["code"],
            error["param"],
            response.headers.get("x-should-retry"),
            "retry-after" in response.headers,
        )
    return found


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_each_fault_gets_the_same_answer_on_every_api(http, fault):
    found = answers(http, fault)
    assert {path: answer[2] for path, answer in found.items()} == fault.params
    assert {(status, code, retry, after) for status, code, _, retry, after in found.values()} == {
        (fault.status, fault.code, None, False)
    }, found


def test_a_spent_request_rate_gets_the_same_429_on_every_api(stack: Stack):
    """Refused bodies count against the request rate, on every API alike: ten of them spend
    the free plan's minute on Pro, and the next request of each API is the same 429."""
    created = serviceai_cli(
        stack.database_url,
        "users",
        "create",
        "--email",
        f"{secrets.token_hex(5)}@parity.test",
        "--with-key",
        "--json",
    )
    stack.secrets.append(created["key"]["key"])
    with httpx.Client(
        base_url=stack.origin,
        timeout=60,
        headers={"Authorization": f"Bearer {created['key']['key']}"},
    ) as http:
        refused = bodies(
            "ServiceAi-Pro", **{p: {"temperature": 3} for p in (CHAT, COMPLETION, RESPONSES)}
        )
        for i in range(10):
            path = (CHAT, COMPLETION, RESPONSES)[i % 3]
            assert http.post(path, json=refused[path]).status_code == 400
        limited = bodies("ServiceAi-Pro", **{CHAT: {}, COMPLETION: {}, RESPONSES: {}})
        found = {}
        for path, body in limited.items():
            response = http.post(path, json=body)
            # Failed once in CI (2026-11-28, chat served): the window's count, to tell a lost
            # count from a late one when it fails again.
            counted = {k: v for k, v in response.headers.items() if k.startswith("x-ratelimit")}
            assert response.status_code == 429, (path, response.status_code, counted)
            error = error_of(response, 429)
            found[path] = (
                error["code"],
                error["type"],
                error["param"],
                response.headers.get("x-should-retry"),
                int(response.headers["retry-after"]) > 0,
            )
    assert set(found.values()) == {("rate_limit_exceeded", "requests", None, None, True)}, found


def test_a_budget_smaller_than_the_request_answers_as_a_spent_one_on_every_api(stack: Stack):
    """An operator set the user's monthly budget below what a request may take: 429
    `insufficient_quota`, `x-should-retry: false`, the message naming the budget, the same on
    every API (it was a retryable-looking `tokens` 429, which the openai client retried)."""
    email = f"{secrets.token_hex(5)}@parity.test"
    created = serviceai_cli(
        stack.database_url, "users", "create", "--email", email, "--with-key", "--json"
    )
    stack.secrets.append(created["key"]["key"])
    serviceai_cli(
        stack.database_url, "users", "set-budget", email, "--monthly-tokens", "1", "--json"
    )
    found = {}
    with httpx.Client(
        base_url=stack.origin,
        timeout=60,
        headers={"Authorization": f"Bearer {created['key']['key']}"},
    ) as http:
        for path, body in bodies(
            "ServiceAi-Fast", **{CHAT: {}, COMPLETION: {}, RESPONSES: {}}
        ).items():
            # The key cache holds the user as it was made: wait until it sees the budget.
            deadline = time.monotonic() + 10 * stack.key_cache_ttl_s
            while (response := http.post(path, json=body)).status_code == 200:
                assert time.monotonic() < deadline, response.text
                time.sleep(0.2)
            error = error_of(response, 429)
            assert "monthly token budget (1 tokens)" in error["message"], error["message"]
            found[path] = (
                error["type"],
                error["code"],
                response.headers.get("x-should-retry"),
                "retry-after" in response.headers,
            )
    assert set(found.values()) == {("insufficient_quota", "insufficient_quota", "false", False)}, (
        found
    )


def test_ten_bombs_at_once_are_refused_before_an_engine_sees_them(stack: Stack, http):
    """Issue 70: a few grammar bombs at a free plan's concurrency held an engine's grammar
    worker. Ten at once (the enum bomb on chat, the regex bomb on completions) are refused by
    the gateway, while another user's request beside them is served."""
    email = f"{secrets.token_hex(5)}@bombs.test"
    user = serviceai_cli(stack.database_url, "users", "create", "--email", email, "--json")
    key = serviceai_cli(stack.database_url, "keys", "create", "--user", user["id"], "--json")
    stack.secrets.append(key["key"])
    enum_bomb = FAULTS[[f.name for f in FAULTS].index("an enum bomb in a JSON schema")]
    regex_bomb = FAULTS[[f.name for f in FAULTS].index("a regex bomb")]
    bombs = [
        (path, fault.requests[path])
        for fault, path in [(enum_bomb, CHAT), (regex_bomb, COMPLETION)] * 5
    ]
    other = {"Authorization": f"Bearer {key['key']}"}
    with ThreadPoolExecutor(len(bombs) + 1) as pool:
        served = pool.submit(
            http.post,
            CHAT,
            json={"model": "ServiceAi-Fast", "messages": [{"role": "user", "content": "hi"}]},
            headers=other,
        )
        refused = list(pool.map(lambda bomb: http.post(bomb[0], json=bomb[1]), bombs))
    assert served.result().status_code == 200, served.result().text
    assert {error_of(r, 400)["code"] for r in refused} == {"grammar_too_complex"}
