"""The replica's Responses handler refuses what its engine cannot do, before vLLM sees it."""

import pytest

from deployments.generation import InvalidGenerationRequest
from deployments.responses import ResponsesServing

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


async def test_function_tools_without_a_tool_call_parser_are_refused_naming_tools():
    serving = ResponsesServing(serving=None, parses_tool_calls=False)  # never reached
    body = {"model": "ServiceAi-Fast", "input": [], "tools": [TOOL], "stream": False}
    with pytest.raises(InvalidGenerationRequest) as refused:
        await anext(serving.respond(body, {}))
    assert (refused.value.status, refused.value.param) == (400, "tools")
    assert "tool-call parser" in refused.value.message
