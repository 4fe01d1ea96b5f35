"""Production's shape on the test stack: a model type as its own application, an ingress over it."""

from __future__ import annotations

import time

import openai
import pytest
from ray import serve

from app.builder import build_app, build_model_type
from deployments.vllm_engine.grammar_budget import BUDGET_ENV
from tests.conftest import app_args


def wait_running(app: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while serve.status().applications[app].status != "RUNNING":
        assert time.monotonic() < deadline, serve.status().applications[app]
        time.sleep(1)


def enum_format(prefix: str) -> dict:
    """Within the ingress's bounds; about 40 ms to compile for the tiny model, past this app's
    budget. Each prefix is a schema of its own: a compile that outlived its budget still ends,
    and the next request with its schema finds the grammar cached."""
    values = [f"{prefix} {i}" for i in range(2000)]
    schema = {"type": "object", "properties": {"c": {"enum": values}}, "required": ["c"]}
    return {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}


def test_ingress_deployed_first_waits_for_its_model_type_application(stack):
    fast = app_args()["model_types"][0]
    # A grammar compile budget of 1 ms: a schema the ingress lets through is past it.
    fast["env_vars"] = {**fast.get("env_vars", {}), BUDGET_ENV: "0.001"}
    edge_args = {
        "ingress": {"num_replicas": 1, "num_cpus": 0.25},
        "model_types": ["ServiceAi-Fast"],  # as production's ingress: the name only
        "separate_model_apps": True,
        "plans": app_args()["plans"],
    }
    # As `serve deploy` may: the ingress application first, its model type's application after.
    serve._run(build_app(edge_args), name="edge", route_prefix="/edge", _blocking=False)
    try:
        serve.run(build_model_type(fast), name="ServiceAi-Fast", route_prefix=None)
        wait_running("edge", timeout_s=120)

        status = serve.status().applications
        assert set(status["edge"].deployments) == {"Ingress"}
        assert set(status["ServiceAi-Fast"].deployments) == {"ModelTypeApp", "ServiceAi-Fast"}
        # The ingress re-reads replica health every 2 s: a type that has just come up may still
        # be refused with 503 and Retry-After, which the client's own retry honours.
        client = openai.OpenAI(
            base_url=f"{stack.origin}/edge/v1", api_key=stack.api_key, max_retries=2
        )
        assert [m.id for m in client.models.list()] == ["ServiceAi-Fast"]
        chunks = list(
            client.chat.completions.create(
                model="ServiceAi-Fast",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
            )
        )
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        a_grammar_past_its_compile_budget_is_refused_by_name(client)
    finally:
        serve.delete("edge")
        serve.delete("ServiceAi-Fast")


def a_grammar_past_its_compile_budget_is_refused_by_name(client: openai.OpenAI) -> None:
    """The engine fails a request whose grammar outlived its compile budget: a 400 naming the
    field, and the engine serves on."""
    messages = [{"role": "user", "content": "pick"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="ServiceAi-Fast",
            messages=messages,
            max_tokens=8,
            response_format=enum_format("whole"),
        )
    error = refused.value.body
    # The same field, as the ingress's own bounds name it.
    param = "response_format.json_schema.schema"
    assert (error["code"], error["param"]) == ("grammar_too_complex", param)
    assert f"compile {param} into a grammar within its budget of 0.001 s" in error["message"]

    with pytest.raises(openai.APIError) as streamed:
        for _ in client.chat.completions.create(
            model="ServiceAi-Fast",
            messages=messages,
            max_tokens=8,
            response_format=enum_format("streamed"),
            stream=True,
        ):
            pass
    assert streamed.value.body["code"] == "grammar_too_complex"

    reply = client.chat.completions.create(model="ServiceAi-Fast", messages=messages, max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")
