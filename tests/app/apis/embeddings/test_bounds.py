"""What the pipeline refuses of an embedding request before a counter moves: the API on the
wrong kind of type, inputs beyond the plan's bounds, an input beyond the context."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.apis.embeddings.call import SPECIAL_TOKENS_BOUND, EmbeddingsCall, input_size
from app.apis.embeddings.protocol import EmbeddingRequest
from app.openai.errors import ApiError
from app.serving.checks import check_api_served, check_inputs
from deployments.wire import Api, ModelInfo
from tests.app.shipped_plans import caller

EMBED = "ServiceAi-Embed"
EMBEDDING = ModelInfo(EMBED, 2048, embedding=True)
GENERATING = ModelInfo("ServiceAi-Fast", 2048, "hermes")
# The free plan's bounds in serve_config.yaml.
FREE_INPUTS, FREE_TOKENS = 256, 100_000


class _Replica:
    """The embedding type's endpoint as check_inputs calls it: the bodies it measured."""

    name = EMBED

    def __init__(self, tokens: int = 10, refusal: ApiError | None = None) -> None:
        self.tokens, self.refusal = tokens, refusal
        self.asked: list[dict] = []

    async def prompt_tokens(self, api: str, body: dict) -> int:
        assert api == "embeddings"
        self.asked.append(body)
        if self.refusal is not None:
            raise self.refusal
        return self.tokens


def embeddings(value) -> EmbeddingsCall:
    return EmbeddingsCall(EmbeddingRequest.model_validate({"model": EMBED, "input": value}))


@pytest.mark.parametrize(
    ("api", "model", "path"),
    [
        (Api.CHAT, EMBEDDING, "/v1/chat/completions"),
        (Api.MESSAGES, EMBEDDING, "/v1/messages"),
        (Api.RESPONSES, EMBEDDING, "/v1/responses"),
        (Api.EMBEDDINGS, GENERATING, "/v1/embeddings"),
    ],
)
def test_an_api_on_the_other_kind_of_type_is_a_400_naming_both(api, model, path):
    with pytest.raises(ApiError) as refused:
        check_api_served(api, model)
    error = refused.value
    assert (error.status, error.param, error.code) == (400, "model", "model_not_supported")
    assert model.name in error.message and path in error.message


def test_each_kind_of_type_serves_its_own_apis():
    check_api_served(Api.EMBEDDINGS, EMBEDDING)
    for api in (Api.CHAT, Api.COMPLETION, Api.RESPONSES, Api.MESSAGES):
        check_api_served(api, GENERATING)


def test_inputs_are_counted_exactly_for_token_ids_and_bounded_for_text():
    assert input_size([[1, 2, 3], [4]]) == (2, 4, 3, True)
    assert embeddings([1, 2, 3]).inputs == (1, 3, 3, True)
    bound = 2 * len("héllo".encode()) + SPECIAL_TOKENS_BOUND
    assert embeddings(["héllo", "héllo"]).inputs == (2, 2 * bound, bound, False)
    assert embeddings("héllo").reply.total == 1  # nothing generated; a token reserved


@pytest.mark.parametrize(
    "value", ["", [], ["a", ""], [[]], [[1, -1]], {"text": "a"}, [1, "a"], ["a"] * 2049]
)
def test_openais_inputs_only(value):
    with pytest.raises(ValidationError):
        EmbeddingRequest.model_validate({"model": EMBED, "input": value})


def test_an_unknown_field_is_named():
    body = EmbeddingRequest.model_validate({"model": EMBED, "input": "a", "truncate": 3})
    assert body.unsupported_field()[0] == "truncate"
    fine = EmbeddingRequest.model_validate({"model": EMBED, "input": "a", "user": "u"})
    assert fine.unsupported_field() is None and "user" not in fine.to_engine()


async def test_too_many_inputs_for_the_plan(limits):
    replica = _Replica()
    with pytest.raises(ApiError) as refused:
        await check_inputs(limits, caller(), replica, EMBEDDING, embeddings(["a"] * 257).inputs, {})
    assert (refused.value.code, refused.value.param) == ("too_many_inputs", "input")
    assert f"allows {FREE_INPUTS}" in refused.value.message and replica.asked == []


async def test_token_ids_beyond_a_bound_are_refused_without_a_replica(limits):
    replica = _Replica()
    over_plan = embeddings([[1] * 2048] * 49).inputs
    with pytest.raises(ApiError) as refused:
        await check_inputs(limits, caller(), replica, EMBEDDING, over_plan, {})
    assert refused.value.code == "too_many_input_tokens"
    assert f"allows {FREE_TOKENS}" in refused.value.message
    with pytest.raises(ApiError) as beyond:
        await check_inputs(
            limits, caller(), replica, EMBEDDING, embeddings([[1] * 2049]).inputs, {}
        )
    assert beyond.value.code == "context_length_exceeded"
    assert replica.asked == []


async def test_short_texts_go_straight_on_long_ones_are_measured(limits):
    replica = _Replica(tokens=FREE_TOKENS + 1)
    await check_inputs(limits, caller(), replica, EMBEDDING, embeddings(["short"] * 3).inputs, {})
    assert replica.asked == []
    many = embeddings(["x" * 1000] * 60)  # at most ~120,000 tokens: measured
    with pytest.raises(ApiError) as refused:
        await check_inputs(limits, caller(), replica, EMBEDDING, many.inputs, {"input": "body"})
    assert refused.value.code == "too_many_input_tokens"
    assert replica.asked == [{"input": "body"}]
    replica.tokens = 5000
    await check_inputs(limits, caller(), replica, EMBEDDING, many.inputs, {"input": "body"})
