"""/v1/messages in-process on a real store: keys as Anthropic's clients send them, and every
refusal in Anthropic's envelope before a replica is asked. Replies: tests/e2e/test_messages.py."""

from __future__ import annotations

import httpx
import pytest

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.anthropic import envelope
from app.apis.messages.protocol import MessagesRequest
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import shipped_limits
from tests.app.serve_fakes import FakeHandle

FAST = "ServiceAi-Fast"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def messages(store: KeyStore):
    """The API with a Fast type no replica serves, and a key sent as `x-api-key`."""
    user = await store.create_user("ada@example.com")
    key = (await store.create_key(user.id)).key
    app = create_api(
        ModelEndpoints({FAST: FakeHandle(FAST)}, created=0),
        KeyVerifier(store),
        shipped_limits(),
        UsageMeter(store),
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://test",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
    ) as client:
        yield client


def anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    assert "Traceback" not in response.text
    return body["error"]["message"]


async def test_a_missing_or_wrong_key_is_anthropics_authentication_error(messages):
    body = {"model": FAST, "max_tokens": 4, "messages": HI}
    wrong = await messages.post("/v1/messages", json=body, headers={"x-api-key": "sai-wrong"})
    anthropic_error(wrong, 401, "authentication_error")
    del messages.headers["x-api-key"]
    missing = await messages.post("/v1/messages", json=body)
    assert "Missing" in anthropic_error(missing, 401, "authentication_error")


@pytest.mark.parametrize(
    ("body", "status", "kind", "named"),
    [
        ({"model": FAST, "messages": HI}, 400, "invalid_request_error", "max_tokens"),
        (
            {"model": FAST, "max_tokens": 4, "messages": []},
            400,
            "invalid_request_error",
            "messages",
        ),
        (
            {"model": FAST, "max_tokens": 4, "messages": HI, "mcp_servers": []},
            400,
            "invalid_request_error",
            "mcp_servers",
        ),
        (
            {
                "model": FAST,
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "x"}}],
                    }
                ],
            },
            400,
            "invalid_request_error",
            "messages[0].content[0]",
        ),
        (
            {"model": "claude-nope", "max_tokens": 4, "messages": HI},
            404,
            "not_found_error",
            "model",
        ),
    ],
)
async def test_refusals_name_the_field_in_anthropics_envelope(messages, body, status, kind, named):
    response = await messages.post("/v1/messages", json=body)
    assert named in anthropic_error(response, status, kind)


async def test_a_type_with_no_replica_is_overloaded_529():
    assert envelope.status_of(503) == 529
    assert envelope.error_body(529, "busy")["error"]["type"] == "overloaded_error"
    assert envelope.error_body(500, "oops")["error"]["type"] == "api_error"
    headers = envelope.headers_of({"x-ratelimit-remaining-requests": "0", "Retry-After": "3"})
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["Retry-After"] == "3"


async def test_the_openai_apis_keep_openais_envelope(messages):
    response = await messages.post("/v1/chat/completions", json={"model": FAST})
    assert set(response.json()) == {"error"}


def turn(*blocks: str) -> dict:
    return {"role": "assistant", "content": [{"type": b, b: "x"} for b in blocks]}


@pytest.mark.parametrize(
    ("keep", "thinking_left_in"),
    [
        ("all", [1, 3, 5]),
        ({"type": "thinking_turns", "value": 2}, [3, 5]),
        (None, [5]),  # Anthropic's default: the last turn's
    ],
)
def test_clear_thinking_leaves_thinking_in_the_last_turns_only(keep, thinking_left_in):
    user = {"role": "user", "content": "hi"}
    messages = [user, turn("thinking", "text"), user, turn("redacted_thinking", "text")]
    messages += [user, turn("thinking", "text"), user]
    edit = {"type": "clear_thinking_20251015"} | ({} if keep is None else {"keep": keep})
    request = MessagesRequest(
        model=FAST, max_tokens=4, messages=messages, context_management={"edits": [edit]}
    )
    assert request.unsupported_field() is None
    body = request.to_engine()
    assert "context_management" not in body
    turns = [(i, m["content"]) for i, m in enumerate(body["messages"]) if m["role"] == "assistant"]
    assert [i for i, content in turns if len(content) == 2] == thinking_left_in
    assert all(content[-1]["type"] == "text" for _, content in turns)


@pytest.mark.parametrize(
    ("context_management", "named"),
    [
        ({"edits": [{"type": "clear_tool_uses_20250919"}]}, "context_management.edits[0]"),
        (
            {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns"}}]},
            "context_management.edits[0].keep",
        ),
        ({"edits": {"type": "clear_thinking_20251015"}}, "context_management.edits"),
    ],
)
def test_other_context_edits_are_refused_by_name(context_management, named):
    request = MessagesRequest(
        model=FAST, max_tokens=4, messages=HI, context_management=context_management
    )
    assert request.unsupported_field()[0] == named
