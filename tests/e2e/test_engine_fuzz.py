"""No request can take an engine down: generated requests, sent in concurrent waves.

Each wave mixes what the API accepts (seeds, `n` and a `best_of` equal to it, every sampling
knob, penalties, logit biases, logprobs, stop strings, structured outputs, forced and automatic
tools, prompts of every length up to and past the context, `max_tokens` near it), on chat,
completions and responses, whole and streamed, across every model type, all at once: prefills
are chunked and batches mix, as under real load. Every answer must be a 200 or a 4xx in the
envelope (a stream: complete, with no error event), and no engine core may have restarted.

Examples are derandomized, so `make test` sends the same waves every run;
SERVICEAI_FUZZ_RANDOM=1 explores new ones (SERVICEAI_FUZZ_WAVES sets how many).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets

import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.conftest import Stack, error_of
from tests.e2e.conftest import MODEL_TYPES, serviceai_cli

CONTEXT = 2048  # every type's max_model_len in the local profile
WAVES = int(os.environ.get("SERVICEAI_FUZZ_WAVES", "8"))
WAVE_SIZE = 24
VOCAB = 700  # past the tiny model's vocabulary, so that some token ids are out of range
WORDS = "the quick brown fox jumps over lazy dog hello how are you today fine thank".split()
TERMINAL = ("response.completed", "response.incomplete")

SCHEMAS = [
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["city", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "n": {"type": "number", "minimum": 0, "maximum": 1},
            "ok": {"type": "boolean"},
            "inner": {
                "type": "object",
                "properties": {"x": {"type": "string", "maxLength": 5}},
                "required": ["x"],
            },
        },
        "required": ["n", "ok", "inner"],
    },
]
FUNCTION = {
    "name": "get_weather",
    "description": "The forecast for a city.",
    "parameters": SCHEMAS[1],
}

finite = {"allow_nan": False, "allow_infinity": False}
prompt_lengths = st.sampled_from([1, 8, 64, 300, 900, 1500, 1900, 2000, 2040, 2100])
reply_lengths = st.one_of(
    st.none(), st.integers(1, 32), st.sampled_from([256, 1000, 1900, 2000, 2040, 2047])
)
sampling = st.fixed_dictionaries(
    {},
    optional={
        "seed": st.integers(-(2**63), 2**63 - 1),
        "temperature": st.floats(0, 2, **finite),
        "top_p": st.floats(0.01, 1, **finite),
        "top_k": st.sampled_from([-1, 0, 1, 2, 40, 100_000]),
        "min_p": st.floats(0, 1, **finite),
        "frequency_penalty": st.floats(-2, 2, **finite),
        "presence_penalty": st.floats(-2, 2, **finite),
        "repetition_penalty": st.floats(0.05, 2, **finite),
        "logit_bias": st.dictionaries(
            st.integers(0, VOCAB).map(str), st.floats(-100, 100, **finite), max_size=6
        ),
        "stop": st.lists(st.sampled_from(WORDS + ["\n", "}", "a", "<|im_end|>"]), max_size=4),
        "min_tokens": st.integers(0, 40),
        "ignore_eos": st.booleans(),
        "stop_token_ids": st.lists(st.integers(0, VOCAB), max_size=3),
        "bad_words": st.lists(st.sampled_from(WORDS), max_size=2),
        "allowed_token_ids": st.lists(st.integers(0, VOCAB), min_size=1, max_size=20),
        "prompt_logprobs": st.integers(0, 5),
        "truncate_prompt_tokens": st.sampled_from([-1, 1, 100, 2047]),
        "include_stop_str_in_output": st.booleans(),
        "skip_special_tokens": st.booleans(),
    },
)
response_formats = st.one_of(
    st.just({"type": "text"}),
    st.just({"type": "json_object"}),
    st.sampled_from(SCHEMAS).map(
        lambda s: {"type": "json_schema", "json_schema": {"name": "out", "schema": s}}
    ),
)
tool_choices = st.sampled_from(
    ["none", "auto", "required", {"type": "function", "function": {"name": "get_weather"}}]
)


@st.composite
def text_of(draw, tokenizer) -> str:
    """About `length` tokens of text that no other request's prompt starts with."""
    length = draw(prompt_lengths)
    salt = secrets.token_hex(4)
    words = " ".join(WORDS[i % len(WORDS)] for i in range(length + 8))
    ids = tokenizer.encode(f"{salt} {words}", add_special_tokens=False)[:length]
    return tokenizer.decode(ids)


@st.composite
def chat(draw, tokenizer) -> tuple[str, dict]:
    body = {
        "model": draw(st.sampled_from(MODEL_TYPES)),
        "messages": [{"role": "user", "content": draw(text_of(tokenizer))}],
        "max_tokens": draw(reply_lengths),
        "n": draw(st.integers(1, 8)),
        "stream": draw(st.booleans()),
        **draw(sampling),
    }
    if draw(st.booleans()):
        body["logprobs"] = True
        body["top_logprobs"] = draw(st.integers(0, 20))
    if draw(st.booleans()):
        body["response_format"] = draw(response_formats)
    elif draw(st.booleans()):
        body["tools"] = [{"type": "function", "function": FUNCTION}]
        body["tool_choice"] = draw(tool_choices)
        body["parallel_tool_calls"] = draw(st.booleans())
    if body["stream"] and draw(st.booleans()):
        body["stream_options"] = {"include_usage": True}
    return "/v1/chat/completions", _without_none(body)


@st.composite
def completion(draw, tokenizer) -> tuple[str, dict]:
    n = draw(st.integers(1, 4))
    prompt = draw(
        st.one_of(
            text_of(tokenizer),
            prompt_lengths.map(lambda k: [secrets.randbelow(VOCAB) for _ in range(k)]),
            st.lists(text_of(tokenizer), min_size=1, max_size=3),
        )
    )
    body = {
        "model": draw(st.sampled_from(MODEL_TYPES)),
        "prompt": prompt,
        "max_tokens": draw(reply_lengths),
        "n": n,
        "best_of": draw(st.sampled_from([None, n])),
        "stream": draw(st.booleans()),
        "logprobs": draw(st.one_of(st.none(), st.integers(0, 5))),
        "echo": draw(st.booleans()),
        **draw(sampling),
    }
    return "/v1/completions", _without_none(body)


@st.composite
def response(draw, tokenizer) -> tuple[str, dict]:
    body = {
        "model": draw(st.sampled_from(MODEL_TYPES)),
        "input": draw(text_of(tokenizer)),
        "max_output_tokens": draw(reply_lengths),
        "stream": draw(st.booleans()),
        "store": draw(st.booleans()),
    }
    knobs = draw(sampling)
    for name in ("seed", "temperature", "top_p", "ignore_eos"):
        if name in knobs:
            body[name] = knobs[name]
    if draw(st.booleans()):
        body["text"] = {
            "format": draw(
                st.one_of(
                    st.just({"type": "text"}),
                    st.just({"type": "json_object"}),
                    st.sampled_from(SCHEMAS).map(
                        lambda s: {"type": "json_schema", "name": "out", "schema": s}
                    ),
                )
            )
        }
    elif draw(st.booleans()):
        body["tools"] = [{"type": "function", **FUNCTION}]
        choice = draw(tool_choices)
        body["tool_choice"] = (
            {"type": "function", "name": "get_weather"} if isinstance(choice, dict) else choice
        )
    return "/v1/responses", _without_none(body)


def _without_none(body: dict) -> dict:
    return {name: value for name, value in body.items() if value is not None}


def wave(tokenizer):
    return st.lists(
        st.one_of(chat(tokenizer), completion(tokenizer), response(tokenizer)),
        min_size=WAVE_SIZE,
        max_size=WAVE_SIZE,
    )


async def _send(client: httpx.AsyncClient, path: str, body: dict) -> str | None:
    """What is wrong with the answer to one request, or None."""
    if not body.get("stream"):
        response = await client.post(path, json=body)
        if response.status_code == 200:
            return None
        if response.status_code >= 500:
            return f"{response.status_code} {response.text[:300]}"
        error_of(response, response.status_code)
        return None
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            if response.status_code >= 500:
                return f"{response.status_code} {response.text[:300]}"
            error_of(response, response.status_code)
            return None
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line != "data: [DONE]"]
    errors = [event for event in events if "error" in event or event.get("type") == "error"]
    if errors:
        return f"error event: {json.dumps(errors[0])[:300]}"
    if path == "/v1/responses":
        last = events[-1].get("type") if events else None
        return None if last in TERMINAL else f"ended with {last}"
    return None if lines and lines[-1] == "data: [DONE]" else "ended without [DONE]"


def engine_cores(stack: Stack) -> dict[str, tuple[int, ...]]:
    return {m: stack.handle(m).process_ids.remote().result(timeout_s=30)[1] for m in MODEL_TYPES}


def test_no_generated_request_takes_an_engine_down(stack, tokenizer):
    _, key = _user(stack)
    before = engine_cores(stack)

    @settings(
        max_examples=WAVES,
        deadline=None,
        database=None,
        derandomize=not os.environ.get("SERVICEAI_FUZZ_RANDOM"),
        phases=[Phase.generate],  # a dead engine fails every later wave: nothing to shrink
        suppress_health_check=list(HealthCheck),
    )
    @given(wave(tokenizer))
    def each_wave(requests: list[tuple[str, dict]]) -> None:
        async def send_all() -> list[str | None]:
            async with httpx.AsyncClient(
                base_url=stack.origin, headers={"Authorization": f"Bearer {key}"}, timeout=300
            ) as client:
                return await asyncio.gather(*(_send(client, p, b) for p, b in requests))

        problems = [
            f"{path} {json.dumps(body)[:600]}\n  -> {problem}"
            for (path, body), problem in zip(requests, asyncio.run(send_all()))
            if problem is not None
        ]
        assert not problems, "\n".join(problems)
        assert engine_cores(stack) == before, "an engine core restarted during this wave"

    each_wave()


def _user(stack: Stack) -> tuple[str, str]:
    """A user of its own on the largest plan, so that the waves meet few limits and use up
    none of the other tests'."""
    created = serviceai_cli(
        stack.database_url,
        "users",
        "create",
        "--email",
        f"{secrets.token_hex(5)}@fuzz.test",
        "--plan",
        "pro",
        "--with-key",
        "--json",
    )
    stack.secrets.append(created["key"]["key"])
    return created["user"]["id"], created["key"]["key"]
