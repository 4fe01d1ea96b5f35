"""A type that reasons, on every API: ServiceAi-Pro (vLLM's `deepseek_v3` reasoning parser; the
tiny model's template opens <think> when asked, as opt-in templates do). The random model
rarely closes its thinking: a reply that reasons is reasoning up to its limit. Where a test
needs some reasoning it samples greedily (the generated model is the same on every machine)
and past end-of-text: sampled, one reply in a few hundred began with end-of-text or </think>
and reasoned nothing (a CI run failed on it)."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai

from tests.conftest import Stack

PRO = "ServiceAi-Pro"
HI = [{"role": "user", "content": "hi"}]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
GREEDY_MESSAGE = {"temperature": 0}
"""Anthropic's client refuses a temperature beside thinking (Anthropic's API takes only 1 then);
the service takes any, and Messages have no ignore_eos."""


def reasoning_of(message) -> str | None:
    extra = message.model_extra or {}
    return extra.get("reasoning") or extra.get("reasoning_content")


def test_chat_reasons_when_asked_and_answers_plainly_otherwise(client: openai.OpenAI):
    plain = client.chat.completions.create(
        model=PRO, messages=HI, max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert plain.choices[0].message.content and not reasoning_of(plain.choices[0].message)
    thought = client.chat.completions.create(
        model=PRO,
        messages=HI,
        max_tokens=8,
        reasoning_effort="high",
        **GREEDY,
    )
    assert reasoning_of(thought.choices[0].message)
    assert thought.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model=PRO, messages=HI, max_tokens=8, reasoning_effort="low", stream=True, **GREEDY
    )
    streamed = "".join(
        reasoning_of(chunk.choices[0].delta) or "" for chunk in stream if chunk.choices
    )
    assert streamed


def test_responses_reason_and_take_their_reasoning_back_as_codex_sends_it(client: openai.OpenAI):
    first = client.responses.create(
        model=PRO,
        input="hi",
        reasoning={"effort": "medium", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        store=False,
        max_output_tokens=8,
        **GREEDY,
    )
    [reasoning] = [item for item in first.output if item.type == "reasoning"]
    assert reasoning.content and reasoning.content[0].text
    # Stateless, as Codex: the whole conversation again, the reasoning item included.
    again = client.responses.create(
        model=PRO,
        input=[
            {"role": "user", "content": "hi"},
            reasoning.model_dump(exclude_none=True),
            {"role": "user", "content": "and now?"},
        ],
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
        store=False,
        max_output_tokens=8,
    )
    assert again.status in ("completed", "incomplete")
    with client.responses.stream(
        model=PRO, input="hi", reasoning={"effort": "high"}, max_output_tokens=8, **GREEDY
    ) as events:
        kinds = {event.type for event in events}
    assert "response.reasoning_text.delta" in kinds


def test_messages_think_in_thinking_blocks(stack: Stack):
    claude = anthropic.Anthropic(base_url=stack.origin, api_key=stack.api_key, max_retries=0)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = claude.messages.create(
        model=PRO, max_tokens=1100, messages=HI, thinking=thinking, extra_body=GREEDY_MESSAGE
    )
    assert message.content[0].type == "thinking" and message.content[0].thinking
    with claude.messages.stream(
        model=PRO, max_tokens=1100, messages=HI, thinking=thinking, extra_body=GREEDY_MESSAGE
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "thinking" in {block.type for block in final.content}
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"


def first_blocks(stack: Stack, **fields) -> list[str]:
    """The types of a streamed message's content blocks, read off the raw events."""
    response = httpx.post(
        f"{stack.origin}/v1/messages",
        headers={"x-api-key": stack.api_key},
        json={"model": PRO, "max_tokens": 8, "messages": HI, "stream": True, **fields},
        timeout=60,
    )
    events = [
        json.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    return [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]


def test_messages_think_when_thinking_is_asked_for_at_the_effort_the_client_sets(stack: Stack):
    effort = {"output_config": {"effort": "low"}}
    adaptive = first_blocks(stack, thinking={"type": "adaptive"}, temperature=0, **effort)
    assert adaptive[0] == "thinking"
    # As Anthropic's: an effort alone (Claude Code sends one on every turn) opens no thinking.
    assert "thinking" not in first_blocks(stack, **effort)
    assert "thinking" not in first_blocks(stack, thinking={"type": "disabled"}, **effort)
