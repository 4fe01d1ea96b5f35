"""An ingress-only application serving the model types of the main one."""

from __future__ import annotations

import openai
from ray import serve

from app.builder import build_app
from tests.conftest import APP_NAME, app_args
from tests.e2e.conftest import ALL_TYPES


def test_second_ingress_dispatches_to_the_same_engines(stack):
    args = dict(app_args(), models_app=APP_NAME)
    args["ingress"] = dict(args["ingress"], num_replicas=2)
    serve.run(build_app(args), name="alt", route_prefix="/alt")
    try:
        client = openai.OpenAI(
            base_url=f"{stack.origin}/alt/v1", api_key=stack.api_key, max_retries=0
        )
        assert [m.id for m in client.models.list()] == ALL_TYPES
        chunks = list(
            client.chat.completions.create(
                model="ServiceAi-Pro",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
            )
        )
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert "alt" not in serve.status().applications[APP_NAME].deployments
        assert set(serve.status().applications["alt"].deployments) == {"Ingress"}
    finally:
        serve.delete("alt")
