"""What a request makes an engine compile is bounded before admission: the enum and regex
bombs of issue 70 are refused by name, and schemas as real clients send them pass."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from app.limits.structure_bounds import (
    CODE,
    check_regex,
    check_schema,
    check_structured_outputs,
)
from app.openai.errors import ApiError


class Address(BaseModel):
    street: str = Field(max_length=200)
    city: str
    postcode: str = Field(pattern=r"^[0-9]{5}(-[0-9]{4})?$")
    country: Literal["DE", "FR", "GB", "US", "JP", "BR", "IN", "CN", "ZA", "AU"]


class Person(BaseModel):
    name: str
    email: str = Field(pattern=r"^[a-z0-9._%+-]{1,64}@[a-z0-9.-]{1,255}\.[a-z]{2,24}$")
    age: int = Field(ge=0, le=150)
    addresses: list[Address] = Field(max_length=10)
    manager: Person | None = None


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


REAL = [
    Person.model_json_schema(),  # $defs, a recursive reference, patterns, an enum
    {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(500)}},
    {"type": "string", "enum": [f"country-{i}" for i in range(250)]},
    nested(60),
]


@pytest.mark.parametrize("schema", REAL, ids=["pydantic", "500 fields", "250 enum", "depth 60"])
def test_schemas_real_clients_send_pass(schema):
    check_schema(schema, "response_format.json_schema.schema")


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        # The enum bomb of issue 70: 30,000 values (3 s of one compile thread here).
        ({"type": "string", "enum": [f"v{i}" for i in range(30_000)]}, "enum values"),
        (nested(70), "levels"),
        (
            {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(5001)}},
            "properties",
        ),
        ({"type": "string", "enum": ["x" * 60_000, "y" * 60_001]}, "characters"),
        ({"type": "string", "pattern": "((ab|a){1,300}c){1,300}"}, "repetitions"),
    ],
    ids=["enum", "depth", "properties", "characters", "pattern"],
)
def test_a_schema_past_a_bound_is_a_400_naming_the_field_and_the_bound(schema, said):
    with pytest.raises(ApiError) as refused:
        check_schema(schema, "tools[3].function.parameters")
    error = refused.value
    assert (error.status, error.code, error.param) == (400, CODE, "tools[3].function.parameters")
    assert said in error.message


def test_a_body_nested_far_deeper_than_python_recurses_is_refused_not_crashed():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ApiError):
        check_schema({"type": "array", "default": deep}, "text.format.schema")


@pytest.mark.parametrize(
    "pattern",
    [r"^\d{3}-\d{4}$", r"[a-z]{1,64}@[a-z]{1,64}\.com", r"(?:[A-Z][a-z]+ ){0,20}", "a*b+c?"],
)
def test_regexes_real_clients_send_pass(pattern):
    check_regex(pattern, "structured_outputs.regex")


@pytest.mark.parametrize(
    "pattern", ["((ab|a){1,300}c){1,300}", "(a{1,200}){1,200}", "x" * 5000, "[a-z]{20000}"]
)
def test_a_regex_bomb_is_refused_by_name(pattern):
    with pytest.raises(ApiError) as refused:
        check_structured_outputs({"regex": pattern})
    assert refused.value.param == "structured_outputs.regex"


def test_structured_outputs_choice_grammar_and_json_are_bounded():
    check_structured_outputs({"choice": ["yes", "no"]})
    for value, param in [
        ({"choice": [str(i) for i in range(5001)]}, "structured_outputs.choice"),
        ({"grammar": "root ::= " + '"a" ' * 20_000}, "structured_outputs.grammar"),
        ({"json": nested(70)}, "structured_outputs.json"),
    ]:
        with pytest.raises(ApiError) as refused:
            check_structured_outputs(value)
        assert refused.value.param == param
