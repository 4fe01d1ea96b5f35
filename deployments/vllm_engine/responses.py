"""/v1/responses on vLLM's own Responses handler (`OpenAIServingResponses`), a `ServedApi`.

vLLM renders the input items with the chat template, applies text.format and tool_choice as
structured outputs, parses tool calls and emits OpenAI's stream events. What it must not do
here is keep responses: its store lives in this process's memory (and stays off, as
VLLM_ENABLE_RESPONSES_API_STORE is unset). The gateway sends the whole conversation, keeps the
stored responses in its database, and says in the body's `store` and `previous_response_id`
what it does with them: vLLM gets `store: false` and no previous id, and the response objects
it makes say what the gateway does (`_echoed`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.renderers.inputs.preprocess import extract_prompt_len
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.v1.engine.async_llm import AsyncLLM

from deployments.model_type import ToolStrictLevel
from deployments.vllm_engine.completions import compact_json
from deployments.vllm_engine.counting import counting_client
from deployments.vllm_engine.forced_tool_calls import is_forced
from deployments.vllm_engine.replies import Event, stream_error

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# vLLM-only fields of its response object; OpenAI's clients do not know them.
_VLLM_ONLY = {
    "kv_transfer_params",
    "ec_transfer_params",
    "input_messages",
    "output_messages",
    "metrics",
}
_ECHOED = ("store", "previous_response_id")


def build_serving(
    engine: AsyncLLM,
    models: OpenAIServingModels,
    tool_call_parser: str | None,
    tool_strict_level: ToolStrictLevel,
    reasoning_parser: str | None,
) -> OpenAIServingResponses:
    """vLLM's Responses handler on the replica's engine, its store off, with the serving
    layer's `models` (the adapters it holds); with the type's reasoning parser, a reply's
    reasoning is a reasoning item."""
    client = counting_client(engine)
    renderer = OnlineRenderer(
        model_config=engine.model_config,
        renderer=engine.renderer,
        request_logger=None,
        chat_template=None,
        chat_template_content_format="auto",
        trust_request_chat_template=False,
        trust_request_mm_kwargs=False,
        enable_auto_tools=tool_call_parser is not None,
        exclude_tools_when_tool_choice_none=False,
        tool_parser=tool_call_parser,
        tool_strict_level=tool_strict_level,
        reasoning_parser=reasoning_parser,
        default_chat_template_kwargs=None,
        log_error_stack=False,
    )
    serving = OpenAIServingResponses(
        client,
        models,
        renderer,
        request_logger=None,
        chat_template=None,
        chat_template_content_format="auto",
        enable_auto_tools=tool_call_parser is not None,
        tool_parser=tool_call_parser,
        reasoning_parser=reasoning_parser or "",
        enable_prompt_tokens_details=True,
    )
    if serving.enable_store:
        raise RuntimeError(
            "VLLM_ENABLE_RESPONSES_API_STORE must be unset: the gateway stores responses."
        )
    return serving


class ResponsesApi:
    """One POST /v1/responses request on vLLM's Responses handler.

    What the gateway does with the response (the body's `store` and `previous_response_id`)
    is taken out of the body vLLM gets, and echoed in the response objects vLLM makes.
    """

    request_type = ResponsesRequest
    prompt_param = "input"

    def __init__(self, serving: OpenAIServingResponses, body: dict[str, Any]) -> None:
        self._serving = serving
        self._echo = {name: body.pop(name, None) for name in _ECHOED}
        self._forced = is_forced(body.get("tool_choice"))
        body["store"] = False

    def create(self, request: ResponsesRequest) -> Any:
        return self._serving.create_responses(request)

    def create_error_response(self, error: Exception) -> ErrorResponse:
        return self._serving.create_error_response(error)

    def schema_param(self, body: dict[str, Any]) -> str:
        return "text.format" if body.get("text") else "tools"

    def body(self, result: ResponsesResponse, request: ResponsesRequest) -> bytes:
        self._finished(result)
        return result.model_dump_json(by_alias=True, exclude=_VLLM_ONLY).encode()

    def _finished(self, response: Any) -> None:
        """The response as the client gets it: compact call arguments, what the gateway does
        with it echoed, and no forced call that the length limit cut short (as OpenAI)."""
        if self._forced and response.status == "incomplete":
            response.output = [
                item for item in response.output if getattr(item, "type", None) != "function_call"
            ]
        _compact_calls(response)
        _echoed(response, self._echo)

    async def events(
        self, stream: AsyncGenerator[Any, None], request: Any
    ) -> AsyncGenerator[Event, None]:
        """OpenAI's stream events, encoded; the terminal one held apart (`final`). vLLM's
        `error` event is raised, for the ingress to frame."""
        try:
            async for event in stream:
                if event.type == "error":
                    raise stream_error(event.message)
                response = getattr(event, "response", None)
                if response is not None:
                    self._finished(response)
                    data = event.model_dump_json(by_alias=True, exclude={"response": _VLLM_ONLY})
                else:
                    data = event.model_dump_json(by_alias=True)
                if event.type in TERMINAL_EVENTS:
                    yield Event(b"", data.encode(), last=True)
                else:
                    yield Event(b"event: %s\ndata: %s\n\n" % (event.type.encode(), data.encode()))
        finally:
            await stream.aclose()

    async def prompt_tokens(self, request: ResponsesRequest) -> int | ErrorResponse:
        rendered = await self._serving.online_renderer.render_responses(
            request, previous_messages=None, previous_response_outputs=None, tool_server=None
        )
        if isinstance(rendered, ErrorResponse):
            return rendered
        return extract_prompt_len(self._serving.model_config, rendered.engine_input)


def _compact_calls(response: Any) -> None:
    for item in getattr(response, "output", None) or ():
        if getattr(item, "type", None) == "function_call":
            item.arguments = compact_json(item.arguments)


def _echoed(response: Any, echo: dict[str, Any]) -> Any:
    for name, value in echo.items():
        setattr(response, name, value)
    return response
