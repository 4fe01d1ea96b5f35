"""Claude Code (`@anthropic-ai/claude-code`) and Codex (`@openai/codex`), pinned in tests/e2e/node,
against the service.

`claude -p` sends what Claude Code sends on every turn: its long system prompt and its tool
set (~50 KB; ~17,000 tokens with the long-context model's tokenizer), `thinking` with
`display: omitted`, `context_management`, a `system` message among the messages, tools with
`defer_loading`, to `/v1/messages?beta=true` with `Authorization: Bearer`. The type it lands on
is the local profile's Pro (a reasoning parser, hermes tools) on the generated `tiny-long`
model, whose 65,536 positions hold that prompt; the tiny model's 2,048 do not. `codex exec`
sends the Responses API what Codex sends on every turn: `store: false`, `reasoning`,
`include: ["reasoning.encrypted_content"]`, `prompt_cache_key`, `client_metadata`, its function
tools and ~20 KB of developer instructions.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anthropic
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    set_tracing_disabled,
)
from openai.types.shared import Reasoning

from tests.conftest import Stack, app_args
from tests.e2e.conftest import async_clients
from tests.e2e.test_limits import ingress_app, new_user, usage_of

CLAUDE = Path(__file__).with_name("node") / "node_modules" / ".bin" / "claude"
CODEX = CLAUDE.with_name("codex")
set_tracing_disabled(True)  # the Agents SDK would send traces to OpenAI
# Codex on the service's Responses API. Its web search is a built-in tool and its multi-agent
# tools a `namespace` tool, which the service does not offer: both off, as for any provider
# that serves function tools only. It asks for no reasoning: the random model would reason
# until it stops, and Codex prints the answer only.
CODEX_CONFIG = """
model = "{model}"
model_provider = "serviceai"
model_reasoning_effort = "none"
web_search = "disabled"

[features]
multi_agent = false

[model_providers.serviceai]
name = "ServiceAi"
base_url = "{base_url}"
env_key = "SERVICEAI_API_KEY"
wire_api = "responses"
"""
LONG = "ServiceAi-Long"
CONTEXT = 65536


def long_context_type() -> dict:
    """The local profile's ServiceAi-Pro, renamed, on the tiny-long model."""
    pro = next(t for t in app_args()["model_types"] if t["name"] == "ServiceAi-Pro")
    engine_args = {**pro["engine_args"], "max_model_len": CONTEXT}
    return {**pro, "name": LONG, "model": "tiny-long", "engine_args": engine_args}


def with_long_type(plans: dict) -> dict:
    """Every plan, with the long type's limits those of its Pro."""
    return {name: {**plan, LONG: plan["ServiceAi-Pro"]} for name, plan in plans.items()}


def run_agent(command: list[str], home: Path, env: dict[str, str]) -> None:
    """Run an agent's CLI headless in `home`, which it takes for the user's home; it exits 0.
    It prints the reply, which may be empty: the generated model may end its turn at once."""
    result = subprocess.run(
        command,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": os.environ["PATH"], "HOME": str(home), **env},
    )
    assert result.returncode == 0, (result.stdout, result.stderr)


@pytest.fixture(scope="module")
def agent(stack: Stack):
    """(base URL, key): an application of its own with the long-context type, Claude Code's
    model ids aliased to it, and a new pro-plan user's key."""
    with ingress_app(
        stack,
        "claude",
        models_app=None,
        model_types=[long_context_type()],
        model_aliases={"claude-*": LONG},
        plans=with_long_type(app_args()["plans"]),
    ) as base_url:
        _, key = new_user(stack, plan="pro")
        yield base_url.removesuffix("/v1"), key


def test_claude_code_answers_through_the_service(agent, tmp_path: Path):
    origin, key = agent
    run_agent(
        [str(CLAUDE), "-p", "Say hello in one word.", "--max-turns", "1"],
        tmp_path,
        {
            "ANTHROPIC_BASE_URL": origin,
            "ANTHROPIC_AUTH_TOKEN": key,
            # Thinking off: the random model would think until max_tokens, and Claude Code
            # takes a reply cut there for a failure. Its effort still comes (`medium`).
            "CLAUDE_CODE_DISABLE_THINKING": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
    )
    usage = usage_of(f"{origin}/v1", key, 1)
    assert usage["models"] == [LONG] and usage["requests"] == 1
    # Its system prompt and tools, whole: far beyond the tiny model's 2,048 positions.
    assert usage["prompt_tokens"] > 10_000
    assert 0 < usage["completion_tokens"] < 512


def test_codex_answers_through_the_service(stack: Stack, agent, tmp_path: Path):
    origin, _ = agent
    _, key = new_user(stack, plan="pro")
    home = tmp_path / ".codex"
    home.mkdir()
    (home / "config.toml").write_text(CODEX_CONFIG.format(model=LONG, base_url=f"{origin}/v1"))
    run_agent(
        [str(CODEX), "exec", "--skip-git-repo-check", "Say hello in one word."],
        tmp_path,
        {"CODEX_HOME": str(home), "SERVICEAI_API_KEY": key},
    )
    usage = usage_of(f"{origin}/v1", key, 1)
    assert usage["models"] == [LONG] and usage["requests"] == 1
    assert usage["prompt_tokens"] > 5_000  # its instructions and tools, whole


def test_claude_codes_request_shape_with_thinking_omitted(stack: Stack):
    """What Claude Code sends besides, on the stack's Pro: a `system` message among the
    messages, clear_thinking, a deferred tool, and thinking whose text it asks to leave out of
    the reply (the blocks stay, empty, as Anthropic sends them)."""
    claude = anthropic.Anthropic(base_url=stack.origin, api_key=stack.api_key, max_retries=0)
    request = {
        "model": "claude-opus-5-5",
        "max_tokens": 16,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]},
        ],
        "thinking": {"type": "adaptive"},
        "tools": [
            {
                "name": "Later",
                "description": "A tool the model finds by search.",
                "input_schema": {"type": "object", "properties": {}},
                "defer_loading": True,
            }
        ],
        # Greedy (Anthropic's client refuses a temperature beside thinking): sampled, a reply
        # may begin with end-of-text or </think> and think nothing (tests/e2e/test_reasoning.py).
        "extra_body": {
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "temperature": 0,
        },
    }
    shown = claude.messages.create(**request)
    assert shown.content[0].type == "thinking" and shown.content[0].thinking
    omitted = {**request, "thinking": {"type": "adaptive", "display": "omitted"}}
    with claude.messages.stream(**omitted) as stream:
        kinds = {event.type for event in stream}
        streamed = stream.get_final_message()
    assert "thinking" not in kinds  # no thinking_delta: the SDK's own thinking event
    for message in (claude.messages.create(**omitted), streamed):
        assert (message.content[0].type, message.content[0].thinking) == ("thinking", "")
        assert 0 < message.usage.output_tokens <= 16  # thought and counted, not shown


def test_context_edits_other_than_clear_thinking_are_refused_by_name(agent):
    origin, key = agent
    claude = anthropic.Anthropic(base_url=origin, api_key=key, max_retries=0)
    for edits, param in (
        ([{"type": "clear_tool_uses_20250919"}], "context_management.edits[0]"),
        ([{"type": "clear_thinking_20251015", "keep": "none"}], "context_management.edits[0].keep"),
    ):
        with pytest.raises(anthropic.BadRequestError) as refused:
            claude.messages.create(
                model="claude-opus-5-5",
                max_tokens=4,
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"context_management": {"edits": edits}},
            )
        assert param in refused.value.message


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_the_agents_sdk_with_reasoning_settings(agent, api):
    """The OpenAI Agents SDK's reasoning settings (`reasoning_effort` on chat; `reasoning` and,
    without storage, `include: reasoning.encrypted_content` on Responses) on the long type,
    whose replies end (the SDK takes a reply cut at max_tokens for a failure), and the
    reasoning sent back on the next turn, as a client that keeps no state does."""
    origin, key = agent
    async with async_clients(f"{origin}/v1", key) as (client,):
        responses = api == "responses"
        model = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
        settings = ModelSettings(
            reasoning=Reasoning(effort="low", summary="auto" if responses else None),
            max_tokens=400,
            store=False if responses else None,
            response_include=["reasoning.encrypted_content"] if responses else None,
        )
        thinker = Agent(
            name="thinker",
            instructions="Think, then answer.",
            model=model(model=LONG, openai_client=client),
            model_settings=settings,
        )
        first = await Runner.run(thinker, "Why is the sky blue?", max_turns=1)
        then = [*first.to_input_list(), {"role": "user", "content": "And at night?"}]
        second = await Runner.run(thinker, then, max_turns=1)
    [first_usage], [second_usage] = [
        [r.usage for r in run.raw_responses] for run in (first, second)
    ]
    assert 0 < first_usage.output_tokens < 400
    # The second turn's input holds the first (the reasoning too on Responses, where the SDK
    # sends its item back; not on chat, whose templates drop earlier turns' reasoning).
    assert second_usage.input_tokens > first_usage.input_tokens
