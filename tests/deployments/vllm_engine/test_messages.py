"""The replica's Messages API around vLLM's Anthropic handler: `thinking.display: omitted`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest

from deployments.vllm_engine.messages import MessagesApi

HI = [{"role": "user", "content": "hi"}]
EVENTS = [
    'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    '"content_block":{"type":"thinking","thinking":"","signature":""}}\n\n',
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"thinking_delta","thinking":"hmm"}}\n\n',
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"signature_delta","signature":"abc"}}\n\n',
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,'
    '"delta":{"type":"text_delta","text":"\\"type\\":\\"thinking_delta\\""}}\n\n',
    'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


def request(display: str | None) -> AnthropicMessagesRequest:
    thinking = {"type": "enabled", "budget_tokens": 1024, "display": display}
    return AnthropicMessagesRequest(model="m", max_tokens=2048, messages=HI, thinking=thinking)


@pytest.mark.parametrize("display", [None, "summarized", "omitted"])
async def test_omitted_thinking_sends_its_blocks_without_their_text(display):
    async def stream():
        for event in EVENTS:
            yield event

    api = MessagesApi(SimpleNamespace())
    sent = [e.data.decode() async for e in api.events(stream(), request(display))]
    dropped = [EVENTS[1]] if display == "omitted" else []
    assert sent == [e for e in EVENTS if e not in dropped]


def test_a_final_assistant_message_is_continued_as_anthropics_prefill():
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    MessagesApi(SimpleNamespace())  # installs the continuation, once per process
    MessagesApi(SimpleNamespace())
    prefill = [*HI, {"role": "assistant", "content": "The answer is"}]
    chat = AnthropicServingMessages.to_chat_completion_request(
        AnthropicMessagesRequest(model="m", max_tokens=8, messages=prefill)
    )
    assert chat.messages[-1] == {"role": "assistant", "content": "The answer is"}
    assert chat.continue_final_message is True and chat.add_generation_prompt is False
    turn = AnthropicServingMessages.to_chat_completion_request(
        AnthropicMessagesRequest(model="m", max_tokens=8, messages=HI)
    )
    assert turn.continue_final_message is False and turn.add_generation_prompt is True
