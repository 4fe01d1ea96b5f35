"""Forced tool calls (`tool_choice` required or a named function) that always parse.

vLLM 0.32 constrains a forced call of a parser that knows its model's call format (hermes: the
`<tool_call>` envelope around the arguments) with an xgrammar structural tag, and compiles it
with unlimited whitespace: `disable_any_whitespace` reaches only the JSON and JSON-object
grammars, and a tag's JSON schemas leave `max_whitespace_cnt` unset. A random-weight model
padded `"arguments": {` with whitespace up to `max_tokens`, and the reply came back as text
with no `tool_calls`; on /v1/responses the arguments were not even held to the schema.

vLLM has a second path for forced calls: a JSON schema (the named function's `parameters`, or
for `required` an array of `{name, parameters}`) compiled as JSON, so without free whitespace,
and parsed into `tool_calls` with no model-specific format at all. It takes it only for parsers
that declare `supports_required_and_named`, which VLLM_ENFORCE_STRICT_TOOL_CALLING turns off for
every parser with a structural tag. Here, in each model replica: forced choices skip the tag
and take the JSON path; automatic choices keep vLLM's tag, with at most one whitespace
character in a row; and a type with no tool-call parser gets one that serves forced calls only
(an automatic choice needs the model's own format, and the gateway refuses it there).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.base.protocol import DeltaMessage, ExtractedToolCallInformation
from vllm.parser.abstract_parser import DelegatingParser
from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

FORCED_ONLY = "serviceai_forced_only"
"""The tool parser of a type whose config names none: forced calls only."""
MAX_WHITESPACE = 1
"""Whitespace characters in a row that an automatic call's JSON may hold (xgrammar needs >= 1)."""


class ForcedCallsOnly(ToolParser):
    """Finds no call in free text (the model's own call format is unknown); forced calls need
    no parsing of that format: they come from vLLM's JSON-schema path."""

    supports_required_and_named = True

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any,
    ) -> DeltaMessage | None:
        return DeltaMessage(content=delta_text)


def install(tool_call_parser: str | None) -> str:
    """Make forced calls take vLLM's JSON path in this process; the tool-call parser to give
    vLLM for a type configured with `tool_call_parser` (FORCED_ONLY for None)."""
    if not getattr(DelegatingParser._apply_structural_tag, "_serviceai", False):
        DelegatingParser._apply_structural_tag = _structural_tag_for_automatic_calls(  # type: ignore[method-assign]
            DelegatingParser._apply_structural_tag
        )
    if tool_call_parser is None:
        ToolParserManager.register_module(name=FORCED_ONLY, module=ForcedCallsOnly, force=True)
        return FORCED_ONLY
    # The parser declares what it parses for forced choices: the JSON of vLLM's schema path.
    ToolParserManager.get_tool_parser(tool_call_parser).supports_required_and_named = True
    return tool_call_parser


def is_forced(tool_choice: Any) -> bool:
    """`required`, or a named function (chat's and responses' shapes alike)."""
    return tool_choice == "required" or (
        tool_choice is not None and not isinstance(tool_choice, str)
    )


def _structural_tag_for_automatic_calls(apply: Any) -> Any:
    @functools.wraps(apply)
    def apply_structural_tag(self: DelegatingParser, request: Any) -> Any:
        if is_forced(request.tool_choice):
            return request  # the tool parser's adjust_request sets the JSON schema
        request = apply(self, request)
        outputs = getattr(request, "structured_outputs", None)
        if outputs is not None and outputs.structural_tag:
            outputs.structural_tag = bounded_whitespace(outputs.structural_tag)
        return request

    apply_structural_tag._serviceai = True  # type: ignore[attr-defined]
    return apply_structural_tag


def bounded_whitespace(structural_tag: str) -> str:
    """The tag with at most MAX_WHITESPACE whitespace characters in a row in each JSON it holds."""
    tag = json.loads(structural_tag)

    def bound(node: Any) -> None:
        if isinstance(node, list):
            for value in node:
                bound(value)
        elif isinstance(node, dict):
            if node.get("type") == "json_schema":  # a format; its `json_schema` is the user's
                if node.get("max_whitespace_cnt") is None:
                    node["max_whitespace_cnt"] = MAX_WHITESPACE
                return
            for value in node.values():
                bound(value)

    bound(tag)
    return json.dumps(tag)
