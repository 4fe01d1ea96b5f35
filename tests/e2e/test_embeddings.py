"""/v1/embeddings on the real stack: ServiceAi-Embed (the generated embedding model on vLLM's
pooling runner) through the official openai client and LangChain, with keys, plans and usage."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import openai
import pytest
from langchain_openai import OpenAIEmbeddings

from tests.conftest import Stack, error_of
from tests.e2e.test_key_scopes import scoped_key
from tests.e2e.test_limits import usage_of

EMBED = "ServiceAi-Embed"
WIDTH = 64
"""The generated model's hidden size: its vectors' length."""
TEXTS = ["The quick brown fox.", "def add(a, b): return a + b", "Hello, how are you?"]


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-4 for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def free_key(stack: Stack) -> str:
    """A free-plan user's key: its plan bounds a request to 256 inputs, 100,000 tokens."""
    return scoped_key(stack)["key"]


def test_a_batch_comes_back_in_input_order_as_each_alone(client: openai.OpenAI):
    batch = client.embeddings.create(model=EMBED, input=TEXTS)
    assert batch.model == EMBED and batch.object == "list"
    assert [d.index for d in batch.data] == [0, 1, 2]
    for item, text in zip(batch.data, TEXTS, strict=True):
        assert len(item.embedding) == WIDTH
        assert abs(norm(item.embedding) - 1) < 1e-3  # normalised: cosine is a dot product
        alone = client.embeddings.create(model=EMBED, input=text).data[0].embedding
        assert close(alone, item.embedding)
    assert batch.usage.prompt_tokens == batch.usage.total_tokens > len(TEXTS)
    assert not close(batch.data[0].embedding, batch.data[1].embedding)


def test_floats_and_base64_are_the_same_vector(stack: Stack, http: httpx.Client):
    # The official client asks for base64 and decodes it; here both come raw.
    floats = http.post("/v1/embeddings", json={"model": EMBED, "input": TEXTS[0]}).json()
    encoded = http.post(
        "/v1/embeddings",
        json={"model": EMBED, "input": TEXTS[0], "encoding_format": "base64"},
    ).json()
    raw = base64.b64decode(encoded["data"][0]["embedding"])
    decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert close(decoded, floats["data"][0]["embedding"])
    assert floats["usage"] == encoded["usage"]


def test_token_ids_and_shortened_vectors(client: openai.OpenAI):
    ids = client.embeddings.create(model=EMBED, input=[[5, 6, 7], [8, 9]])
    assert [len(d.embedding) for d in ids.data] == [WIDTH, WIDTH]
    assert ids.usage.prompt_tokens == 5  # token ids are counted as sent
    one = client.embeddings.create(model=EMBED, input=[5, 6, 7])
    assert close(one.data[0].embedding, ids.data[0].embedding)

    short = client.embeddings.create(model=EMBED, input=TEXTS[0], dimensions=16)
    assert len(short.data[0].embedding) == 16
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=EMBED, input=TEXTS[0], dimensions=20)
    assert refused.value.body["param"] == "dimensions"
    assert "16, 32, 64" in refused.value.body["message"]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"input": ""}, "input", "must not be an empty string"),
        ({"input": []}, "input", "must not be an empty list"),
        ({"input": ["fine", ""]}, "input", "input[1] must not be an empty string"),
        ({"input": [[]]}, "input", "none empty"),
        ({"input": [[1, 2, 99999]]}, "input", "out of vocabulary"),
        ({"input": "x" * 5000}, "input", "maximum context length"),
        ({"input": [[1] * 2049]}, "input", "maximum context length"),
        ({"input": "hi", "encoding_format": "bytes"}, "encoding_format", "float"),
        ({"input": "hi", "truncate_prompt_tokens": 3}, "truncate_prompt_tokens", "Unrecognized"),
    ],
)
def test_bad_inputs_are_refused_by_name(http: httpx.Client, body: dict, param: str, says: str):
    response = http.post("/v1/embeddings", json={"model": EMBED, **body})
    error = error_of(response, 400)
    assert error["param"] == param, error
    assert says in error["message"], error


def test_each_api_on_the_other_kind_of_type_is_a_400_naming_both(http: httpx.Client):
    chat = {"model": EMBED, "messages": [{"role": "user", "content": "hi"}]}
    error = error_of(http.post("/v1/chat/completions", json=chat), 400)
    assert error["code"] == "model_not_supported" and error["param"] == "model"
    assert EMBED in error["message"] and "/v1/embeddings" in error["message"]
    assert "/v1/chat/completions" in error["message"]
    embedding = {"model": "ServiceAi-Fast", "input": "hi"}
    error = error_of(http.post("/v1/embeddings", json=embedding), 400)
    assert error["code"] == "model_not_supported" and "ServiceAi-Fast" in error["message"]
    # The same fault on Anthropic's API, in its envelope.
    messages = {"model": EMBED, "max_tokens": 4, "messages": chat["messages"]}
    refused = http.post("/v1/messages", json=messages)
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "/v1/embeddings" in refused.json()["error"]["message"]


def test_a_plan_bounds_the_inputs_of_a_request(stack: Stack, free_key: str):
    client = openai.OpenAI(base_url=stack.base_url, api_key=free_key, max_retries=0)
    client.embeddings.create(model=EMBED, input=["a"] * 256)
    with pytest.raises(openai.BadRequestError) as many:
        client.embeddings.create(model=EMBED, input=["a"] * 257)
    assert many.value.body["code"] == "too_many_inputs"
    assert "allows 256" in many.value.body["message"]
    # 49 inputs of 2,048 token ids: each fits the context, together beyond the plan's 100,000.
    with pytest.raises(openai.BadRequestError) as long:
        client.embeddings.create(model=EMBED, input=[[7] * 2048] * 49)
    assert long.value.body["code"] == "too_many_input_tokens"
    assert "100352 tokens" in long.value.body["message"]


def test_a_key_scoped_to_embeddings_and_its_usage(stack: Stack):
    key = scoped_key(stack, "--models", EMBED)
    client = openai.OpenAI(base_url=stack.base_url, api_key=key["key"], max_retries=0)
    assert [m.id for m in client.models.list().data] == [EMBED]
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(
            model="ServiceAi-Fast", messages=[{"role": "user", "content": "hi"}]
        )
    first = client.embeddings.create(model=EMBED, input=TEXTS)
    second = client.embeddings.create(model=EMBED, input=[[3] * 100])
    usage = usage_of(stack.base_url, key["key"], 2)
    assert usage == {
        "requests": 2,
        "prompt_tokens": first.usage.prompt_tokens + 100,
        "completion_tokens": 0,
        "models": [EMBED],
    }
    assert second.usage.prompt_tokens == 100


def test_langchain_embeddings(stack: Stack):
    # LangChain counts tokens with tiktoken unless told not to; its encodings come from the
    # internet, which a deployment may not reach: it sends the texts as they are.
    embeddings = OpenAIEmbeddings(
        model=EMBED,
        base_url=stack.base_url,
        api_key=stack.api_key,
        check_embedding_ctx_length=False,
        chunk_size=2,
        max_retries=0,
    )
    vectors = embeddings.embed_documents(TEXTS)  # in two requests of at most 2
    assert [len(v) for v in vectors] == [WIDTH] * 3
    query = embeddings.embed_query(TEXTS[2])
    assert close(query, vectors[2])
