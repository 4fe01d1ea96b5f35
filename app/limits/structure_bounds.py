"""Bounds on what one request makes an engine compile: JSON schemas (response formats, the
parameters of tools a call is forced to), regular expressions, grammars and choice lists, on
every API, before admission. An automatic tool choice compiles nothing: its schemas are only
text of the prompt, bounded as the prompt is.

The engine compiles a grammar for each constrained request in its own process; a schema with an
enum of 30,000 values took 3 s to compile here (xgrammar, one thread) and held the engine's
grammar worker while it did. The bounds are OpenAI's documented ones for structured outputs where
it has them (5,000 properties, 120,000 characters of names and values), looser where a real
client needs more (64 levels of nesting against OpenAI's 10; 5,000 enum values against 1,000);
at the bounds xgrammar compiled each kind in under a second here (bench/NOTES.md).
A refusal is a 400 naming the field and the bound, the same on every API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from app.openai.errors import ApiError
from app.openai.protocol import Structure
from deployments.wire import GRAMMAR_PARAM

MAX_SCHEMA_DEPTH = 128
"""Levels of JSON objects and arrays: a schema level is two (the schema and its properties)."""
MAX_SCHEMA_PROPERTIES = 5000
MAX_ENUM_VALUES = 5000
MAX_SCHEMA_CHARS = 120_000
"""Property and definition names, enum and const values, patterns: their characters summed."""
MAX_REGEX_CHARS = 4096
MAX_REGEX_EXPANSION = 10_000
"""A regex's size with every bounded repetition written out: `((ab|a){1,300}c){1,300}` is
about 270,000 and is refused; `[a-z]{1,64}@[a-z]{1,64}` is 129."""
MAX_GRAMMAR_CHARS = 65_536
MAX_CHOICES = MAX_ENUM_VALUES
CODE = "grammar_too_complex"


def check_structures(structures: Iterable[Structure]) -> None:
    """Every schema and `structured_outputs` a request carries within the bounds."""
    for param, kind, value in structures:
        if kind == "schema":
            check_schema(value, param)
        else:
            check_structured_outputs(value, param)


def marked(payload: dict[str, Any], structures: Iterable[Structure]) -> dict[str, Any]:
    """`payload` naming the field whose grammar the engine compiles, if any: the replica
    refuses by that name a grammar its engine could not compile within its budget
    (deployments.vllm_engine.grammar_budget)."""
    param = next((param for param, _, _ in structures), None)
    if param is not None:
        payload[GRAMMAR_PARAM] = param
    return payload


def refuse(param: str, what: str, bound: str) -> ApiError:
    return ApiError(
        400,
        f"{param} is too complex to constrain decoding with: {what}; the most is {bound}. "
        "Simplify it (fewer values or levels, shorter patterns).",
        param=param,
        code=CODE,
    )


def check_schema(schema: Any, param: str) -> None:
    """A JSON schema within the bounds, or a 400 naming `param` (the schema's field). One pass
    over its objects and arrays, without recursion: a body nested thousands deep costs no
    Python stack."""
    properties = enums = chars = 0
    stack = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise refuse(
                param,
                f"it nests deeper than {MAX_SCHEMA_DEPTH} levels of objects and arrays",
                f"{MAX_SCHEMA_DEPTH} levels (64 of properties)",
            )
        if type(node) is list:
            stack.extend((child, depth + 1) for child in node if type(child) in _NESTED)
            continue
        if type(node) is not dict:
            continue
        for key, value in node.items():
            if type(value) in _NESTED:
                stack.append((value, depth + 1))
            if key in _NAMED and type(value) is dict:
                properties += len(value)
                chars += sum(map(len, value))
            elif key == "enum" and type(value) is list:
                enums += len(value)
                chars += sum(_chars(v) for v in value)
            elif key == "const":
                chars += _chars(value)
            elif key == "pattern" and type(value) is str:
                chars += len(value)
                check_regex(value, param)
        if properties > MAX_SCHEMA_PROPERTIES:
            raise refuse(param, f"it has more than {MAX_SCHEMA_PROPERTIES} properties", "5,000")
        if enums > MAX_ENUM_VALUES:
            raise refuse(param, f"it has more than {MAX_ENUM_VALUES} enum values", "5,000")
        if chars > MAX_SCHEMA_CHARS:
            raise refuse(
                param,
                f"its names, enum and const values and patterns hold more than "
                f"{MAX_SCHEMA_CHARS} characters",
                "120,000 characters",
            )


def _chars(value: Any) -> int:
    """A value's characters as the grammar holds them (never str() of a huge integer, which
    Python refuses past 4,300 digits)."""
    return len(value) if isinstance(value, str) else 1


_NESTED = (dict, list)
_NAMED = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def check_regex(pattern: Any, param: str) -> None:
    """A regular expression within the bounds, or a 400 naming `param`."""
    if not isinstance(pattern, str):
        return  # the engine's serving layer names a pattern that is not a string
    if len(pattern) > MAX_REGEX_CHARS:
        raise refuse(param, f"the pattern is {len(pattern)} characters long", "4,096")
    if _expansion(pattern) > MAX_REGEX_EXPANSION:
        raise refuse(
            param,
            "its bounded repetitions written out make it more than "
            f"{MAX_REGEX_EXPANSION} elements long",
            "10,000",
        )


_REPEAT = re.compile(r"\{(\d+)(,?)(\d*)\}|\{,(\d+)\}")


def _expansion(pattern: str) -> int:
    """The pattern's length with each bounded repetition (`{n}`, `{n,m}`) of a group or an
    atom written out: `x{1,300}` is 300 x's. An unbounded one (`*`, `+`, `{n,}` past its n)
    loops in the automaton and counts once; alternatives add up. Groups are read from the
    parentheses; a character class or an escape is one element."""
    sizes = [0]  # the size of each open group so far
    last = 0  # the size of the element a quantifier would repeat
    i = 0
    while i < len(pattern):
        char = pattern[i]
        repeat = _REPEAT.match(pattern, i) if char == "{" else None
        if repeat is not None:
            low, comma, high, only_high = repeat.groups()
            times = int(only_high or high or low) if (high or only_high or not comma) else 1
            times = max(times, int(low or 0), 1)
            sizes[-1] += last * (times - 1)
            last, i = 0, repeat.end()
            continue
        if char == "\\":
            last, i = 1, i + 2
        elif char == "[":
            end = i + 2 if pattern[i + 1 : i + 2] == "]" else i + 1
            while end < len(pattern) and pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            last, i = 1, end + 1
        elif char == "(":
            sizes.append(0)
            last, i = 0, i + 1
            continue
        elif char == ")" and len(sizes) > 1:
            last, i = sizes.pop(), i + 1
        else:
            last, i = 1, i + 1
        sizes[-1] += last
    return sum(sizes)


def check_structured_outputs(value: Any, param: str = "structured_outputs") -> None:
    """vLLM's `structured_outputs` (json, regex, choice, grammar) within the bounds."""
    if not isinstance(value, dict):
        return
    if "json" in value:
        check_schema(value["json"], f"{param}.json")
    check_regex(value.get("regex"), f"{param}.regex")
    choice = value.get("choice")
    if isinstance(choice, list):
        if len(choice) > MAX_CHOICES:
            raise refuse(f"{param}.choice", f"it lists {len(choice)} choices", "5,000")
        if sum(_chars(c) for c in choice) > MAX_SCHEMA_CHARS:
            raise refuse(f"{param}.choice", "its choices are too long", "120,000 characters")
    grammar = value.get("grammar")
    if isinstance(grammar, str) and len(grammar) > MAX_GRAMMAR_CHARS:
        raise refuse(f"{param}.grammar", f"it is {len(grammar)} characters long", "65,536")
