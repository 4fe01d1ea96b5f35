"""Every reply that promises JSON and finishes is JSON a strict parser reads, and matches its
schema: `response_format` and `text.format`, forced calls (`required`, a named function) on
chat and responses, whole and streamed.

Schemas are drawn (strings with and without length bounds, enums, integers and numbers,
booleans, nested objects, arrays, optional fields) and each is sent in every shape at once to
the random-weight model, the harshest client of constrained decoding: xgrammar's own grammar
let it write raw control characters into a length-bounded string in 10 of 24 replies
(deployments/vllm_engine/strict_json.py). A reply the length limit cut is not finished, and
promises nothing but its finish reason; enough of them finish for the test to mean something.

Examples are derandomized, so `make test` sends the same schemas every run;
SERVICEAI_FUZZ_RANDOM=1 draws new ones.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter

import httpx
import jsonschema
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from tests.conftest import Stack

SCHEMAS = int(os.environ.get("SERVICEAI_STRICT_JSON_SCHEMAS", "12"))
MAX_TOKENS = 160
TERMINAL = ("response.completed", "response.incomplete")
names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


def strings() -> st.SearchStrategy[dict]:
    bounded = st.builds(
        lambda low, extra: {"type": "string", "minLength": low, "maxLength": low + extra},
        st.integers(0, 3),
        st.integers(1, 10),
    )
    return st.one_of(
        bounded,
        st.builds(lambda high: {"type": "string", "maxLength": high}, st.integers(1, 16)),
        st.just({"type": "string"}),
        st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=4, unique=True).map(
            lambda values: {"type": "string", "enum": values}
        ),
    )


def scalars() -> st.SearchStrategy[dict]:
    return st.one_of(
        strings(),
        st.just({"type": "integer"}),
        st.integers(-5, 5).map(
            lambda low: {"type": "integer", "minimum": low, "maximum": low + 10}
        ),
        st.just({"type": "number"}),
        st.just({"type": "boolean"}),
    )


def objects(values: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    return st.dictionaries(names, values, min_size=1, max_size=4).flatmap(
        lambda properties: st.lists(st.sampled_from(sorted(properties)), unique=True).map(
            lambda required: {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            }
        )
    )


def arrays(items: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    return st.builds(
        lambda item, most: {"type": "array", "items": item, "maxItems": most},
        items,
        st.integers(1, 3),
    )


schemas = objects(st.one_of(scalars(), arrays(scalars()), objects(scalars())))


def strict(text: str, schema: dict) -> str | None:
    """What is wrong with `text` as JSON of `schema` (None: nothing)."""
    try:
        value = json.loads(text)  # strict: a raw control character in a string fails
    except ValueError as exc:
        return f"not strict JSON ({exc}): {text!r}"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return f"does not match its schema ({exc.message}): {text!r}"
    return None


def sse(lines: list[str]) -> list[dict]:
    return [
        json.loads(line[6:])
        for line in lines
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


class Shapes:
    """One drawn schema sent in every shape; each returns (finished, problem or None)."""

    def __init__(self, client: httpx.AsyncClient, schema: dict, seed: int) -> None:
        self.client, self.schema, self.seed = client, schema, seed
        self.chat_tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        self.responses_tools = [{"type": "function", "name": "f", "parameters": schema}]

    async def post(self, path: str, body: dict, stream: bool) -> list[str] | dict:
        body = {**body, "model": "ServiceAi-Fast", "temperature": 1.0, "stream": stream}
        if not stream:
            response = await self.client.post(path, json=body)
            assert response.status_code == 200, response.text
            return response.json()
        async with self.client.stream("POST", path, json=body) as response:
            assert response.status_code == 200, await response.aread()
            body = await response.aread()
        # SSE ends a line at CR or LF only; a JSON string may hold U+2028 or U+0085 raw.
        return [line for line in body.decode().split("\n") if line]

    def chat(self, **fields) -> dict:
        return {
            "messages": [{"role": "user", "content": "Answer in JSON."}],
            "max_tokens": MAX_TOKENS,
            "seed": self.seed,
            **fields,
        }

    def responses(self, **fields) -> dict:
        return {"input": "Answer in JSON.", "max_output_tokens": MAX_TOKENS, **fields}

    async def chat_format(self, stream: bool) -> tuple[bool, str | None]:
        body = self.chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": self.schema, "strict": True},
            }
        )
        reply = await self.post("/v1/chat/completions", body, stream)
        if stream:
            chunks = [c for c in sse(reply) if c["choices"]]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            finish = chunks[-1]["choices"][0]["finish_reason"]
        else:
            text, finish = (
                reply["choices"][0]["message"]["content"],
                reply["choices"][0]["finish_reason"],
            )
        return finish == "stop", strict(text, self.schema) if finish == "stop" else None

    async def chat_call(self, choice: object, stream: bool) -> tuple[bool, str | None]:
        body = self.chat(tools=self.chat_tools, tool_choice=choice)
        reply = await self.post("/v1/chat/completions", body, stream)
        if stream:
            chunks = [c for c in sse(reply) if c["choices"]]
            finish = chunks[-1]["choices"][0]["finish_reason"]
            arguments: dict[int, str] = {}
            for chunk in chunks:
                for call in chunk["choices"][0]["delta"].get("tool_calls") or ():
                    arguments[call["index"]] = arguments.get(call["index"], "") + (
                        call["function"].get("arguments") or ""
                    )
            calls = list(arguments.values())
        else:
            finish = reply["choices"][0]["finish_reason"]
            calls = [
                c["function"]["arguments"]
                for c in reply["choices"][0]["message"].get("tool_calls") or ()
            ]
        if finish == "length":
            return False, None
        if not calls:
            return True, f"a forced call finished ({finish}) with no call"
        return True, next(filter(None, (strict(c, self.schema) for c in calls)), None)

    async def responses_reply(self, stream: bool, **fields) -> dict:
        reply = await self.post("/v1/responses", self.responses(**fields), stream)
        if not stream:
            return reply
        events = sse(reply)
        assert events[-1]["type"] in TERMINAL, events[-1]
        return events[-1]["response"]

    async def responses_format(self, stream: bool) -> tuple[bool, str | None]:
        response = await self.responses_reply(
            stream,
            text={
                "format": {
                    "type": "json_schema",
                    "name": "answer",
                    "schema": self.schema,
                    "strict": True,
                }
            },
        )
        if response["status"] != "completed":
            return False, None
        text = "".join(
            part["text"]
            for item in response["output"]
            if item["type"] == "message"
            for part in item["content"]
            if part["type"] == "output_text"
        )
        return True, strict(text, self.schema)

    async def responses_call(self, choice: object, stream: bool) -> tuple[bool, str | None]:
        response = await self.responses_reply(
            stream, tools=self.responses_tools, tool_choice=choice
        )
        if response["status"] != "completed":
            return False, None
        calls = [i["arguments"] for i in response["output"] if i["type"] == "function_call"]
        if not calls:
            return True, "a forced call completed with no function_call item"
        return True, next(filter(None, (strict(c, self.schema) for c in calls)), None)

    def all(self) -> dict[str, object]:
        named_chat = {"type": "function", "function": {"name": "f"}}
        named_responses = {"type": "function", "name": "f"}
        return {
            "chat response_format": self.chat_format(False),
            "chat response_format, streamed": self.chat_format(True),
            "chat required": self.chat_call("required", False),
            "chat named, streamed": self.chat_call(named_chat, True),
            "chat required, streamed": self.chat_call("required", True),
            "responses text.format": self.responses_format(False),
            "responses text.format, streamed": self.responses_format(True),
            "responses named": self.responses_call(named_responses, False),
            "responses required, streamed": self.responses_call("required", True),
        }


def test_every_finished_json_reply_is_strict_json_that_matches_its_schema(stack: Stack):
    finished: Counter[str] = Counter()
    problems: list[str] = []

    @settings(
        max_examples=SCHEMAS,
        deadline=None,
        derandomize=not os.environ.get("SERVICEAI_FUZZ_RANDOM"),
        phases=[Phase.generate],  # every example is a round of real requests: no shrinking
        suppress_health_check=list(HealthCheck),
    )
    @given(schema=schemas, seed=st.integers(0, 2**31 - 1))
    def round_of(schema: dict, seed: int) -> None:
        async def send() -> dict[str, tuple[bool, str | None]]:
            async with httpx.AsyncClient(
                base_url=stack.origin,
                timeout=120,
                headers={"Authorization": f"Bearer {stack.api_key}"},
            ) as client:
                shapes = Shapes(client, schema, seed).all()
                return dict(zip(shapes, await asyncio.gather(*shapes.values())))

        for shape, (done, problem) in asyncio.run(send()).items():
            finished[shape] += done
            if problem:
                problems.append(f"{shape}, schema {json.dumps(schema)}: {problem}")

    round_of()
    assert not problems, "\n".join(problems)
    assert all(finished[shape] for shape in finished), finished  # each shape proved something


class Weather(BaseModel):
    city: str = Field(max_length=12)
    code: str = Field(min_length=1, max_length=4)
    days: int = Field(ge=1, le=7)


def test_the_openai_clients_parse_helpers_read_every_finished_reply(client):
    """`chat.completions.parse` and `responses.parse` validate with pydantic, strictly."""
    parsed = 0
    for seed in range(6):
        reply = client.chat.completions.parse(
            model="ServiceAi-Fast",
            messages=[{"role": "user", "content": "Weather?"}],
            response_format=Weather,
            max_tokens=MAX_TOKENS,
            seed=seed,
        )
        if reply.choices[0].finish_reason == "stop":
            assert isinstance(reply.choices[0].message.parsed, Weather)
            parsed += 1
        response = client.responses.parse(
            model="ServiceAi-Fast",
            input="Weather?",
            text_format=Weather,
            max_output_tokens=MAX_TOKENS,
            store=False,
        )
        if response.status == "completed":
            assert isinstance(response.output_parsed, Weather)
            parsed += 1
    assert parsed
