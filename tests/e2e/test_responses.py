"""The Responses API on the real stack, through the official `openai` client.

Whole and streamed replies, structured output, a tool call and its output, a conversation of
three turns continued through a second ingress application on the same database, the stored
responses (retrieve, input items, delete), another user's key refused everywhere, expiry and
purge, and the fields the service refuses by name.
"""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest
from sqlalchemy import select

from app.accounts.keystore import Database
from app.accounts.keystore.tables import StoredResponseRow
from tests.conftest import Stack
from tests.e2e.test_limits import ingress_app, new_user, usage_of

FAST = "ServiceAi-Fast"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
POLL_S = 30.0
# The tiny model's random weights may end a reply at once (an empty output), or spend its
# tokens on special ones that decode to nothing (no message item): where a test needs text,
# it asks for every token it allows (vLLM's ignore_eos, as in chat) and samples with a seed,
# so that the same weights give the same reply in every run (vLLM's extension).
WHOLE = {"ignore_eos": True, "seed": 5}


def text_of(response) -> str:
    return "".join(
        part.text
        for item in response.output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
    )


def stored_ids(stack: Stack) -> set[str]:
    async def read() -> set[str]:
        database = await Database.open(stack.database_url, migrate_to=None)
        try:
            async with database.transaction() as session:
                return set(await session.scalars(select(StoredResponseRow.id)))
        finally:
            await database.close()

    return asyncio.run(read())


def test_a_whole_response_is_returned_stored_and_retrieved_the_same(client):
    response = client.responses.create(
        model=FAST, input="hi", max_output_tokens=8, extra_body=WHOLE
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.model == FAST and response.store is True
    assert response.status in ("completed", "incomplete")
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == text_of(response)
    assert response.usage.input_tokens > 0 and 0 < response.usage.output_tokens <= 8
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert client.responses.retrieve(response.id).model_dump() == response.model_dump()


def test_a_stream_sends_openais_events_in_order_and_assembles_the_stored_object(client):
    with client.responses.stream(
        model=FAST, input="hello there", max_output_tokens=16, extra_body=WHOLE
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    numbers = [event.sequence_number for event in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    for expected in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert expected in types
    assert types.index("response.output_item.added") < types.index("response.content_part.added")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text == text_of(final)
    assert {e.response.id for e in events if hasattr(e, "response")} == {final.id}
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.usage == final.usage
    assert stored.status == final.status and stored.store is True


def test_structured_output_follows_the_json_schema(client):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["calm", "busy"]}},
        "required": ["ok", "mood"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=FAST,
        input="answer in JSON",
        max_output_tokens=200,
        text={
            "format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
        },
    )
    assert response.status == "completed", response.incomplete_details
    answer = json.loads(response.output_text)
    assert set(answer) == {"ok", "mood"}
    assert isinstance(answer["ok"], bool) and answer["mood"] in ("calm", "busy")


def test_a_named_tool_call_then_the_turn_with_its_output(client):
    called = client.responses.create(
        model=FAST,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=200,
    )
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1, called.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id
    assert set(json.loads(call.arguments)) == {"city"}
    answered = client.responses.create(
        model=FAST,
        previous_response_id=called.id,
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=8,
        extra_body=WHOLE,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert answered.previous_response_id == called.id
    assert [item.type for item in answered.output] == ["message"]
    items = client.responses.input_items.list(answered.id, order="asc", limit=100).data
    assert [item.type for item in items] == ["message", "function_call", "function_call_output"]
    assert items[1].call_id == items[2].call_id == call.call_id


def test_three_turns_by_previous_response_id_through_a_second_ingress(stack, client):
    first = client.responses.create(model=FAST, input="one", max_output_tokens=4, extra_body=WHOLE)
    with ingress_app(stack, "responses-b") as other_base_url:
        other = openai.OpenAI(base_url=other_base_url, api_key=stack.api_key, max_retries=0)
        second = other.responses.create(
            model=FAST,
            input="two",
            previous_response_id=first.id,
            max_output_tokens=4,
            extra_body=WHOLE,
        )
        assert other.responses.retrieve(first.id).id == first.id
    third = client.responses.create(
        model=FAST,
        input="three",
        previous_response_id=second.id,
        max_output_tokens=4,
        extra_body=WHOLE,
    )
    # The replayed history is input: each turn reads everything before it.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    # The history is each turn's input then its output, as returned. A turn's output may be
    # empty: vLLM's output parser leaves out a message with no text, and random weights can
    # spend four tokens on ones that decode to nothing (CI, 2026-11-24).
    items = client.responses.input_items.list(third.id, order="asc", limit=100).data
    said = [item for item in items if getattr(item, "role", None) == "user"]
    assert [item.content[0].text for item in said] == ["one", "two", "three"]
    assert [item.id for item in items] == [
        said[0].id,
        *(item.id for item in first.output),
        said[1].id,
        *(item.id for item in second.output),
        said[2].id,
    ]
    replies = [item for item in items if getattr(item, "role", None) == "assistant"]
    assert "".join(part.text for item in replies for part in item.content) == (
        first.output_text + second.output_text
    )


def test_usage_counts_the_replayed_history_as_the_engine_counted_it(stack):
    _, key = new_user(stack)
    client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    first = client.responses.create(model=FAST, input="count me", max_output_tokens=3)
    second = client.responses.create(
        model=FAST, input="and me", previous_response_id=first.id, max_output_tokens=3
    )
    with client.responses.stream(
        model=FAST, input="me too", previous_response_id=second.id, max_output_tokens=3
    ) as stream:
        third = stream.get_final_response()
    turns = (first, second, third)
    usage = usage_of(stack.base_url, key, expected_requests=3)
    assert usage["requests"] == 3
    assert usage["prompt_tokens"] == sum(t.usage.input_tokens for t in turns)
    assert usage["completion_tokens"] == sum(t.usage.output_tokens for t in turns)


def test_input_items_page_newest_first(client):
    history = [{"role": "user", "content": f"turn {i}"} for i in range(5)]
    response = client.responses.create(model=FAST, input=history, max_output_tokens=2)
    first = client.responses.input_items.list(response.id, limit=2)
    assert [item.content[0].text for item in first.data] == ["turn 4", "turn 3"]
    assert first.has_more
    every = [
        item.content[0].text for item in client.responses.input_items.list(response.id, limit=2)
    ]
    assert every == [f"turn {i}" for i in range(4, -1, -1)]  # the client pages by `after`


def test_delete_forgets_the_response_and_the_conversation(client):
    response = client.responses.create(model=FAST, input="forget me", max_output_tokens=2)
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model=FAST, input="and?", previous_response_id=response.id)
    assert refused.value.body["param"] == "previous_response_id"


def test_another_users_key_gets_404_everywhere(stack, client):
    mine = client.responses.create(model=FAST, input="private", max_output_tokens=2)
    _, key = new_user(stack)
    stranger = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    attempts = [
        lambda: stranger.responses.retrieve(mine.id),
        lambda: stranger.responses.input_items.list(mine.id),
        lambda: stranger.responses.delete(mine.id),
        lambda: stranger.responses.create(model=FAST, input="x", previous_response_id=mine.id),
    ]
    for attempt in attempts:
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert refused.value.body["code"] == "response_not_found"
    assert client.responses.retrieve(mine.id).id == mine.id  # still there for its owner


def test_store_false_keeps_nothing(stack, client):
    response = client.responses.create(model=FAST, input="hi", store=False, max_output_tokens=2)
    assert response.store is False
    assert response.id not in stored_ids(stack)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_an_expired_response_is_gone_and_purged(stack):
    env = {"SERVICEAI_RESPONSE_RETENTION_S": "4", "SERVICEAI_RESPONSE_PURGE_EVERY_S": "1"}
    with ingress_app(stack, "responses-short", env=env) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key=stack.api_key, max_retries=0)
        response = client.responses.create(model=FAST, input="brief", max_output_tokens=2)
        assert client.responses.retrieve(response.id).id == response.id
        deadline = time.monotonic() + POLL_S
        while response.id in stored_ids(stack):
            assert time.monotonic() < deadline, "the expired response was never purged"
            time.sleep(0.5)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response.id)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"background": True, "stream": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
        ({"include": ["file_search_call.results"]}, "include[0]"),
        # Fast does not reason (Pro does: tests/e2e/test_reasoning.py).
        ({"reasoning": {"effort": "high"}}, "reasoning"),
    ],
)
def test_fields_the_service_cannot_honour_are_refused_by_name(client, extra, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=FAST, input="hi", **extra)
    assert refused.value.body["param"] == param
    assert refused.value.body["code"] == "unsupported_parameter"


def test_a_context_too_long_is_refused_before_generation(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=FAST, input="word " * 3000, max_output_tokens=4)
    assert refused.value.body["param"] == "input"


def until_ended(client: openai.OpenAI, response_id: str):
    """Poll a background response as its clients do, until it is neither queued nor running."""
    deadline = time.monotonic() + POLL_S
    while (response := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, response
        time.sleep(0.2)
    return response


def test_a_background_response_is_queued_then_polled_to_its_end_and_charged_once(stack):
    _, key = new_user(stack, plan="pro")
    client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    queued = client.responses.create(
        model=FAST, input="hi", background=True, max_output_tokens=48, extra_body=WHOLE
    )
    assert (queued.status, queued.background, queued.output) == ("queued", True, [])
    with pytest.raises(openai.BadRequestError) as unfinished:
        client.responses.create(model=FAST, input="more", previous_response_id=queued.id)
    assert unfinished.value.body["param"] == "previous_response_id"
    done = until_ended(client, queued.id)
    # Every token it allows (ignore_eos): ended by max_output_tokens, as a foreground one.
    assert (done.status, done.background, done.id) == ("incomplete", True, queued.id)
    assert done.incomplete_details.reason == "max_output_tokens"
    assert text_of(done) and done.usage.output_tokens == 48
    usage = usage_of(stack.base_url, key, 1)
    assert (usage["requests"], usage["completion_tokens"]) == (1, 48)
    # A finished background response continues a conversation as any other.
    then = client.responses.create(
        model=FAST, input="more", previous_response_id=done.id, max_output_tokens=2
    )
    assert then.status in ("completed", "incomplete")


def test_a_background_response_cancelled_through_another_ingress_stops_generating(stack):
    """The cancel reaches the replica that generates through the store: the engine stops,
    and the tokens charged are those generated before it did."""
    _, key = new_user(stack, plan="pro")
    client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    long = {"max_output_tokens": 1900, "extra_body": WHOLE}
    with ingress_app(stack, "responses-cancel") as other_url:
        other = openai.OpenAI(base_url=other_url, api_key=key, max_retries=0)
        queued = client.responses.create(model=FAST, input="hi", background=True, **long)
        deadline = time.monotonic() + POLL_S
        while client.responses.retrieve(queued.id).status == "queued":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        cancelled = other.responses.cancel(queued.id)
        assert (cancelled.id, cancelled.status) == (queued.id, "cancelled")
    # Charged what the engine had reported (every second) when it stopped: nothing, if the
    # cancel came first, and never the 1,900 tokens it was asked for.
    usage = usage_of(stack.base_url, key, 1, timeout_s=5)
    assert usage["requests"] <= 1 and usage["completion_tokens"] < 1900
    assert client.responses.retrieve(queued.id).status == "cancelled"  # nothing overwrote it
    # Ended: cancelling again returns it as it is; a response made in the foreground cannot be.
    assert client.responses.cancel(queued.id).status == "cancelled"
    foreground = client.responses.create(model=FAST, input="hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(foreground.id)


def test_include_logprobs_gives_each_tokens_logprob_and_its_alternatives(client):
    logprobs = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    whole = client.responses.create(
        model=FAST, input="hi", max_output_tokens=8, extra_body=WHOLE, **logprobs
    )
    [part] = [p for item in whole.output if item.type == "message" for p in item.content]
    assert len(part.logprobs) == whole.usage.output_tokens == 8
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in part.logprobs)
    with client.responses.stream(
        model=FAST, input="hi", max_output_tokens=8, extra_body=WHOLE, **logprobs
    ) as stream:
        deltas = [e for e in stream if e.type == "response.output_text.delta"]
    assert sum(len(d.logprobs) for d in deltas) == 8
