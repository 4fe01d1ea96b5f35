"""Property-based fuzzing of every route from the service's own OpenAPI schema (schemathesis).

Target: the real stack over HTTP (HAProxy, the ingress replica, its SQLite key store, the vLLM
engines), so a crash anywhere on the path shows as a 5xx. Generated requests carry a valid key
(the admin token on /admin) so they get past authentication, where the interesting parsing
is; refusals of bad keys have their own tests. Generation length is capped at a few tokens:
what is fuzzed is parsing, validation, dispatch and error mapping, not how long the tiny model
talks, and that keeps thousands of requests within a minute or two of `make test`.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.conftest import Stack

EXAMPLES_PER_ROUTE_AND_MODE = 100
MAX_REPLY_TOKENS = 4
INTERNALS = re.compile(r'Traceback|File "|\.py\b|/work/|site-packages|/tmp/')


def cap_generation(body: object) -> None:
    """Keep a generated chat request short; values the engine refuses up front stay as drawn."""
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 2048:
            body[field] = min(value, MAX_REPLY_TOKENS)
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_REPLY_TOKENS
    value = body.get("min_tokens")
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_REPLY_TOKENS:
        body["min_tokens"] = MAX_REPLY_TOKENS


def sent_strings(*parts: object) -> list[str]:
    """Every string the client sent (path, query, body, keys included), longest first."""
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str) and value:
            found.append(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for part in parts:
        walk(part)
    return sorted(set(found), key=len, reverse=True)


def check_response(
    label: str, response: requests.Response, sent: list[str] = (), path: str = ""
) -> None:
    """No 5xx; an error in its API's envelope (OpenAI's, or under /v1/messages Anthropic's)
    that leaks nothing of the server; a stream that ends as its API's does."""
    assert response.status_code < 500, f"{label}: {response.status_code} {response.text[:500]}"
    anthropic = path.startswith("/v1/messages")
    # schemathesis gives each header as the list of its values.
    streamed = (response.headers.get("content-type") or [""])[0].startswith("text/event-stream")
    if response.status_code >= 400:
        body = response.json()
        if anthropic:
            assert set(body) == {"type", "error"} and body["type"] == "error", f"{label}: {body}"
            assert set(body["error"]) == {"type", "message"}, f"{label}: {body}"
        else:
            assert set(body) == {"error"}, f"{label}: {response.text[:500]}"
            assert set(body["error"]) == {"message", "type", "param", "code"}, f"{label}: {body}"
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        # An error may quote what the client sent (a key id of ".py"), whole or cut short
        # (`'{name[:64]}'`): a match the client itself sent is no leak.
        quoted = [json.dumps(text)[1:-1] for text in sent]
        said = json.dumps(body["error"])
        leaks = [
            match.group()
            for match in INTERNALS.finditer(said)
            if not any(match.group() in text for text in quoted)
        ]
        assert not leaks, f"{label}: {leaks} in {response.text[:500]}"
    elif streamed:
        data = [line for line in response.text.splitlines() if line.startswith("data: ")]
        if anthropic:
            events = [line for line in response.text.splitlines() if line.startswith("event: ")]
            assert events[-1] in ("event: message_stop", "event: error"), f"{label}: {events}"
        elif not path.startswith("/v1/responses"):  # chat and completions end with [DONE]
            assert data.pop() == "data: [DONE]", f"{label}: {data[-3:]}"
        for event in data:
            json.loads(event.removeprefix("data: "))
    elif response.content:
        response.json()


@pytest.fixture(scope="module")
def fuzz_key(stack: Stack) -> str:
    """A user of its own, so that what the fuzzer creates or revokes touches no other test."""
    admin = {"Authorization": f"Bearer {stack.admin_token}"}
    user = httpx.post(
        f"{stack.origin}/admin/users", headers=admin, json={"email": "fuzz@serviceai.test"}
    )
    key = httpx.post(f"{stack.origin}/admin/users/{user.json()['id']}/keys", headers=admin).json()[
        "key"
    ]
    stack.secrets.append(key)
    return key


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_5xx_and_every_error_in_the_envelope(stack: Stack, fuzz_key: str, mode: GenerationMode):
    schema = schemathesis.openapi.from_url(f"{stack.origin}/openapi.json")
    session = requests.Session()
    sent: Counter[str] = Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    for operation in operations:
        token = stack.admin_token if operation.path.startswith("/admin") else fuzz_key

        @settings(
            max_examples=EXAMPLES_PER_ROUTE_AND_MODE,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case) -> None:
            if operation.path in ("/v1/chat/completions", "/v1/messages"):
                cap_generation(case.body)
            response = case.call(
                base_url=stack.origin,
                session=session,
                timeout=60,
                headers={"Authorization": f"Bearer {token}"},
            )
            sent[operation.label] += 1
            sent_by_client = sent_strings(case.path_parameters, case.query, case.body)
            check_response(
                f"{operation.label} {case.body!r:.300}",
                response,
                sent_by_client,
                path=operation.path,
            )

        try:
            fuzz()
        except Unsatisfiable:
            # A route without parameters or body (GET /health) has no invalid request to draw.
            assert (
                mode == GenerationMode.NEGATIVE
                and not operation.body
                and not any(True for _ in operation.iter_parameters())
            ), operation.label
    print(f"{mode}: {sum(sent.values())} requests", dict(sent))
    assert sum(sent.values()) >= 1000, sent
