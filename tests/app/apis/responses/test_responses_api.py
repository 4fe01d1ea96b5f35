"""/v1/responses routes in-process on a real store: ownership, paging, refusals by name.

Creating responses needs a model replica: tests/e2e/test_responses.py covers that.
"""

from contextlib import asynccontextmanager

import httpx
import pytest

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.accounts.keystore.responses import ResponseStore
from app.apis.responses.protocol import ResponseCreateRequest
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import bearer, shipped_limits
from tests.app.serve_fakes import FakeHandle
from tests.conftest import error_of

FAST = "ServiceAi-Fast"


@asynccontextmanager
async def api_with_fast(store: KeyStore, key: str):
    """The API with a Fast type that no replica serves: a refused field never reaches it."""
    app = create_api(
        ModelEndpoints({FAST: FakeHandle(FAST)}, created=0),
        KeyVerifier(store),
        shipped_limits(),
        UsageMeter(store),
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test", headers=bearer(key)
    ) as client:
        yield client


@pytest.fixture
async def keys(store: KeyStore) -> tuple[str, str, str]:
    """(ada's user id, ada's key, bob's key)."""
    ada = await store.create_user("ada@example.com")
    bob = await store.create_user("bob@example.com")
    return ada.id, (await store.create_key(ada.id)).key, (await store.create_key(bob.id)).key


@pytest.fixture
async def saved(store: KeyStore, keys) -> str:
    ada, _, _ = keys
    items = [
        {
            "id": f"msg_{i}",
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": str(i)}],
        }
        for i in range(3)
    ]
    body = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
    await ResponseStore(store.database).save(ada, items, body)
    return "resp_1"


async def test_the_owner_retrieves_pages_and_deletes(api, keys, saved):
    _, ada_key, _ = keys
    api.headers.update(bearer(ada_key))
    got = await api.get(f"/v1/responses/{saved}")
    assert got.status_code == 200 and got.json()["id"] == saved
    page = await api.get(f"/v1/responses/{saved}/input_items", params={"limit": 2})
    assert page.json() == {
        "object": "list",
        "data": [
            {
                "id": "msg_2",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "2"}],
            },
            {
                "id": "msg_1",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "1"}],
            },
        ],
        "first_id": "msg_2",
        "last_id": "msg_1",
        "has_more": True,
    }
    rest = await api.get(
        f"/v1/responses/{saved}/input_items", params={"limit": 2, "after": "msg_1"}
    )
    assert [i["id"] for i in rest.json()["data"]] == ["msg_0"] and not rest.json()["has_more"]
    deleted = await api.delete(f"/v1/responses/{saved}")
    assert deleted.json() == {"id": saved, "object": "response.deleted", "deleted": True}
    assert error_of(await api.get(f"/v1/responses/{saved}"), 404)["code"] == "response_not_found"


async def test_another_user_gets_404_on_every_route(api, keys, saved):
    _, _, bob_key = keys
    api.headers.update(bearer(bob_key))
    for response in (
        await api.get(f"/v1/responses/{saved}"),
        await api.get(f"/v1/responses/{saved}/input_items"),
        await api.delete(f"/v1/responses/{saved}"),
    ):
        error = error_of(response, 404)
        assert error["code"] == "response_not_found" and saved in error["message"]


async def test_no_key_no_answer(api, saved):
    assert error_of(await api.get(f"/v1/responses/{saved}"), 401)["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"background": True, "stream": True}, "background"),
        ({"background": True, "store": False}, "store"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
        ({"include": ["file_search_call.results"]}, "include[0]"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
        ({"input": [{"type": "reasoning", "content": "x"}]}, "input[0].content"),
        ({"truncation": "auto"}, "truncation"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"made_up": 1}, "made_up"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        (
            {
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "tool_choice",
        ),
    ],
)
async def test_what_cannot_be_honoured_is_refused_naming_the_field(store, keys, body, param):
    _, ada_key, _ = keys
    request = {"model": FAST, "input": "hi", **body}
    async with api_with_fast(store, ada_key) as api:
        error = error_of(await api.post("/v1/responses", json=request), 400)
    assert error["param"] == param, error
    assert param.split("[")[0].split(".")[0] in error["message"] or "type" in error["message"]


def test_off_values_that_sdks_send_are_accepted():
    """The Agents SDK sends some refused fields with their 'off' value: not a refusal."""
    ResponseCreateRequest.model_validate(
        {
            "model": FAST,
            "input": "hi",
            "background": False,
            "include": [],
            "truncation": "disabled",
            "reasoning": None,
            "service_tier": "auto",
        }
    ).check()


def test_what_codex_sends_on_every_turn_is_accepted_and_reasoning_comes_back_as_input():
    """Codex sends `reasoning` and `include: ["reasoning.encrypted_content"]` with `store:
    false`, and the reasoning items of the last turn back as input."""
    request = ResponseCreateRequest.model_validate(
        {
            "model": FAST,
            "store": False,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "input": [
                {"type": "message", "role": "user", "content": "hi"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "think"}],
                    "encrypted_content": None,
                },
                {"type": "message", "role": "assistant", "content": "hello"},
            ],
        }
    )
    request.check()
    reasoning = request.new_items()[1]
    assert reasoning == {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "think"}],
    }
    payload = request.payload("resp_x", request.new_items())
    assert payload["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert payload["include"] == ["reasoning.encrypted_content"]


async def test_unsupported_query_parameters_are_refused(api, keys, saved):
    _, ada_key, _ = keys
    api.headers.update(bearer(ada_key))
    error = error_of(await api.get(f"/v1/responses/{saved}", params={"stream": "true"}), 400)
    assert error["param"] == "stream"
