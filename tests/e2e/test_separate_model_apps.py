"""Production's shape on the test stack: a model type as its own application, an ingress over it."""

from __future__ import annotations

import time

import openai
from ray import serve

from app.builder import build_app, build_model_type
from tests.conftest import app_args


def wait_running(app: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while serve.status().applications[app].status != "RUNNING":
        assert time.monotonic() < deadline, serve.status().applications[app]
        time.sleep(1)


def test_ingress_deployed_first_waits_for_its_model_type_application(stack):
    fast = app_args()["model_types"][0]
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
    finally:
        serve.delete("edge")
        serve.delete("ServiceAi-Fast")
