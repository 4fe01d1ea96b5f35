"""Agent frameworks that force tool calls work against the service, as they would against
OpenAI: the OpenAI Agents SDK (chat-completions and Responses models), pydantic-ai (structured
output through an output tool) and LangChain (`bind_tools(tool_choice="any")`,
`with_structured_output`). Each asserts the parsed objects the framework hands back.

The tiny model's weights are random: the forced call's grammar is what makes these pass.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.conftest import Stack
from tests.e2e.conftest import async_clients

MODELS = ["ServiceAi-Fast", "ServiceAi-Coder"]  # a tool-call parser; none (forced calls only)
set_tracing_disabled(True)  # the SDK would send traces to OpenAI


class Weather(BaseModel):
    """The forecast asked for."""

    city: Literal["Paris", "Berlin", "Rome"]
    unit: Literal["C", "F"]
    days: int = Field(ge=1, le=7)


class Answer(BaseModel):
    weather: Literal["sunny", "rainy"]


@pytest.fixture
async def own_client(stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    """An async client of the test's own, closed when it ends (conftest.async_clients)."""
    async with async_clients(stack.base_url, stack.api_key) as (client,):
        yield client


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_the_agents_sdk_forces_its_tool_then_answers_with_the_result(own_client, model, api):
    called: list[tuple[str, str, int]] = []

    @function_tool
    def get_weather(
        city: Literal["Paris", "Berlin", "Rome"], unit: Literal["C", "F"], days: int
    ) -> str:
        """The forecast for a city."""
        called.append((city, unit, days))
        return f"sunny in {city}"

    llm = (
        OpenAIChatCompletionsModel(model=model, openai_client=own_client)
        if api == "chat"
        else OpenAIResponsesModel(model=model, openai_client=own_client)
    )
    settings = dict(max_tokens=300, extra_body={"seed": 3})
    if api == "responses":
        settings["store"] = True
    agent = Agent(
        name="forecaster",
        instructions="Use the tool.",
        tools=[get_weather],
        model=llm,
        model_settings=ModelSettings(tool_choice="get_weather", **settings),
        tool_use_behavior="stop_on_first_tool",
    )

    first = await Runner.run(agent, "What is the weather in Paris?", max_turns=2)
    # The tool-result turn: the model reads the tool's output and answers, in a structured
    # output (a random model's free text may not end before max_tokens).
    answering = agent.clone(
        model_settings=ModelSettings(tool_choice="none", **settings),
        tool_use_behavior="run_llm_again",
        output_type=Answer,
    )
    second = await Runner.run(answering, first.to_input_list(), max_turns=2)
    [(city, unit, days)] = called
    assert city in ("Paris", "Berlin", "Rome") and unit in ("C", "F") and isinstance(days, int)
    assert first.final_output == f"sunny in {city}"
    assert isinstance(second.final_output, Answer)


@pytest.mark.parametrize("model", MODELS)
async def test_pydantic_ai_returns_its_output_type_through_a_forced_output_tool(own_client, model):
    llm = OpenAIChatModel(model, provider=OpenAIProvider(openai_client=own_client))
    agent = PydanticAgent(
        llm,
        output_type=Weather,
        retries=0,
        model_settings={"max_tokens": 300, "extra_body": {"seed": 5}},
    )
    result = await agent.run("What is the weather in Paris?")
    assert isinstance(result.output, Weather)


def langchain_model(stack: Stack, model: str) -> ChatOpenAI:
    return ChatOpenAI(
        model=model,
        base_url=stack.base_url,
        api_key=stack.api_key,
        max_tokens=300,
        max_retries=0,
        seed=7,
        use_responses_api=False,
    )


@pytest.mark.parametrize("model", MODELS)
def test_langchain_bind_tools_with_any_returns_parsed_tool_calls(stack, model):
    @tool
    def get_weather(city: Literal["Paris", "Berlin", "Rome"], unit: Literal["C", "F"]) -> str:
        """The forecast for a city."""
        return "sunny"

    message = (
        langchain_model(stack, model)
        .bind_tools([get_weather], tool_choice="any")
        .invoke("What is the weather in Paris?")
    )
    assert message.tool_calls
    for call in message.tool_calls:
        assert call["name"] == "get_weather"
        assert call["args"]["city"] in ("Paris", "Berlin", "Rome")
        assert call["args"]["unit"] in ("C", "F")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_structured_output_returns_the_model(stack, model, method):
    structured = langchain_model(stack, model).with_structured_output(Weather, method=method)
    assert isinstance(structured.invoke("What is the weather in Paris?"), Weather)
