"""Chat completions through the official client and raw HTTP, on every model type."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.conftest import ALL_TYPES, MODEL_TYPES, prompt_tokens

HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


@pytest.mark.parametrize("model", MODEL_TYPES)
def test_completion_has_the_openai_shape_and_real_usage(client, tokenizer, model):
    response = client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=12, extra_body={"ignore_eos": True}
    )
    assert response.id.startswith("chatcmpl-")
    assert response.object == "chat.completion"
    assert response.model == model
    assert isinstance(response.created, int)
    [choice] = response.choices
    assert (choice.index, choice.message.role, choice.finish_reason) == (0, "assistant", "length")
    assert choice.logprobs is None
    assert isinstance(choice.message.content, str)
    usage = response.usage
    assert usage.prompt_tokens == prompt_tokens(tokenizer, HELLO)
    assert usage.completion_tokens == 12
    assert usage.total_tokens == usage.prompt_tokens + 12


@pytest.mark.parametrize("model", MODEL_TYPES)
def test_stream_has_the_openai_shape(client, tokenizer, model):
    stream = client.chat.completions.create(
        model=model,
        messages=HELLO,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert {(c.id, c.created, c.model, c.object) for c in chunks} == {
        (chunks[0].id, chunks[0].created, model, "chat.completion.chunk")
    }
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    *content, last_content, usage_chunk = chunks
    assert last_content.choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content)
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == 10
    assert usage_chunk.usage.prompt_tokens == prompt_tokens(tokenizer, HELLO)


def test_greedy_stream_and_completion_agree(client):
    """Same prompt, temperature 0: the concatenated stream is the whole completion."""
    request = dict(model="ServiceAi-Fast", messages=HELLO, max_tokens=24, temperature=0)
    whole = client.chat.completions.create(**request)
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**request, stream=True)
        if c.choices
    )
    assert text == whole.choices[0].message.content


async def test_async_client_streams_and_completes(async_client):
    whole = await async_client.chat.completions.create(
        model="ServiceAi-Pro", messages=HELLO, max_tokens=5, seed=7
    )
    assert whole.choices[0].message.role == "assistant"
    stream = await async_client.chat.completions.create(
        model="ServiceAi-Coder", messages=HELLO, max_tokens=5, stream=True
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_raw_sse_framing(http):
    with http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "ServiceAi-Fast", "messages": HELLO, "max_tokens": 4, "stream": True},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: {") and "\n" not in event
        json.loads(event.removeprefix("data: "))


def test_several_choices(client):
    response = client.chat.completions.create(
        model="ServiceAi-Fast", messages=HELLO, n=3, max_tokens=6, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert response.usage.completion_tokens == 18
    chunks = list(
        client.chat.completions.create(
            model="ServiceAi-Fast",
            messages=HELLO,
            n=2,
            max_tokens=4,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_conversation_history_and_text_parts(client, tokenizer):
    messages = [
        {"role": "system", "content": "You translate."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " world"}],
        },
        {"role": "assistant", "content": "Bonjour le monde"},
        {"role": "user", "content": "And in German?"},
    ]
    response = client.chat.completions.create(
        model="ServiceAi-Fast", messages=messages, max_tokens=3
    )
    # vLLM joins the text parts of a message with newlines, as `vllm serve` does.
    flat = [
        dict(m, content=m["content"] if isinstance(m["content"], str) else "Hello\n world")
        for m in messages
    ]
    assert response.usage.prompt_tokens == prompt_tokens(tokenizer, flat)


def test_nothing_reveals_the_concrete_model(http):
    response = http.post(
        "/v1/chat/completions", json={"model": "ServiceAi-Pro", "messages": HELLO, "max_tokens": 3}
    )
    text = response.text + json.dumps(dict(response.headers))
    assert "tiny" not in text and "models/" not in text
    assert response.json()["model"] == "ServiceAi-Pro"


def test_models_are_listed_and_retrieved(client, http):
    assert [m.id for m in client.models.list()] == ALL_TYPES
    assert client.models.retrieve("ServiceAi-Coder").id == "ServiceAi-Coder"
    response = http.get("/v1/models/gpt-4")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def test_health_needs_no_key(stack):
    response = httpx.get(f"{stack.origin}/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_ready_once_every_type_has_a_replica(stack):
    response = httpx.get(f"{stack.origin}/ready")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ready",
        "model_types": {name: "ready" for name in ALL_TYPES},
    }
