"""Every field of vLLM's own request models is accounted for by the gateway: typed and passed
on, accepted as the caller's, honoured as a vLLM extension, refused by name, or withheld (a
vLLM field no client may set here, answered as an unknown field). When a vLLM upgrade adds a
field, these fail and name it: decide which of those it is, in app/openai/."""

from __future__ import annotations

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest as VllmChatRequest,
)
from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest as VllmResponsesRequest

from app.apis.chat import protocol as chat
from app.apis.completions import protocol as completions
from app.apis.responses import protocol as responses
from app.openai.protocol import CALLER_FIELDS, REFUSED_FIELDS, VLLM_FIELDS

# vLLM fields withheld from clients: the engine's scheduling and transport (the gateway sets
# `priority` from the plan), multimodal inputs (the types are text-only), and vLLM features
# the gateway does not serve yet (beam search, reasoning controls, chat templates per request).
WITHHELD = frozenset(
    {
        "priority",
        "request_id",
        "session_id",
        "kv_transfer_params",
        "ec_transfer_params",
        "vllm_xargs",
        "stream_interval",
        "watermarking",
        "routed_experts_prompt_start",
        "return_token_offsets",
        "return_mm_kwargs",
        "return_prompt_text",
        "logprob_token_ids",
        "mm_payload",
        "mm_processor_kwargs",
        "media_io_kwargs",
        "prompt_embeds",
        "truncation_side",
        "use_beam_search",
        "thinking_token_budget",
        "include_reasoning",
        "chat_template",
    }
)
# vLLM's extensions of /v1/responses that the gateway does not pass on (its body is OpenAI's).
RESPONSES_WITHHELD = WITHHELD | {
    "cache_salt",
    "chat_template_kwargs",
    "enable_response_messages",
    "frequency_penalty",
    "include_stop_str_in_output",
    "logit_bias",
    "min_p",
    "presence_penalty",
    "previous_input_messages",
    "repetition_penalty",
    "skip_special_tokens",
    "stop",
    "stop_token_ids",
    "structured_outputs",
    "top_k",
}


def names(model) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


@pytest.mark.parametrize(
    "vllm_model, gateway_model, withheld",
    [
        (VllmChatRequest, chat.ChatCompletionRequest, WITHHELD),
        # A legacy completion's text is free: a JSON format is chat's and responses'.
        (VllmCompletionRequest, completions.CompletionRequest, WITHHELD | {"response_format"}),
    ],
    ids=["chat", "completions"],
)
def test_every_vllm_field_of_chat_and_completions_is_accounted_for(
    vllm_model, gateway_model, withheld
):
    accounted = (
        names(gateway_model)
        | CALLER_FIELDS
        | VLLM_FIELDS
        | set(REFUSED_FIELDS)
        | {"store"}
        | withheld
    )
    assert sorted(names(vllm_model) - accounted) == []
    # What the gateway passes on as vLLM's extensions, vLLM still takes.
    assert sorted(VLLM_FIELDS - names(VllmChatRequest) - names(VllmCompletionRequest)) == []


def test_every_vllm_field_of_responses_is_accounted_for():
    accounted = (
        names(responses.ResponseCreateRequest) | set(responses._REFUSED) | RESPONSES_WITHHELD
    )
    assert sorted(names(VllmResponsesRequest) - accounted) == []


def test_a_withheld_field_is_refused_by_name():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for name in sorted(WITHHELD):
        request = chat.ChatCompletionRequest.model_validate({**body, name: 1})
        assert request.unsupported_field() == (
            name,
            f"Unrecognized request argument supplied: {name}",
        ), name
