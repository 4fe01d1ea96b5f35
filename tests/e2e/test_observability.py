"""What an operator sees of real requests: Ray's metrics endpoint, the access log, request ids."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from app.accounts.keystore import keygen
from tests.conftest import Stack, app_args
from tests.deploy.test_grafana_dashboard import DASHBOARD, metric_names
from tests.e2e.conftest import serviceai_cli

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello there"}]
# Ray prefixes what the service registers with ray_ and counters with _total.
REQUESTS = "ray_serviceai_requests_total"
AUTH_FAILURES = "ray_serviceai_authentication_failures_total"
TTFT_COUNT = "ray_serviceai_time_to_first_token_seconds_count"
DURATION_COUNT = "ray_serviceai_request_duration_seconds_count"
PROMPT = "ray_serviceai_prompt_tokens_total"
COMPLETION = "ray_serviceai_completion_tokens_total"
VLLM_GENERATED = "ray_vllm_generation_tokens_total"
RATE_LIMITED = "ray_serviceai_rate_limited_total"
FREE_PRO_RPM = app_args()["plans"]["free"]["ServiceAi-Pro"]["requests_per_minute"]
GAUGES = ("ray_serviceai_active_streams", "ray_serviceai_queue_depth")
SERIES_LABELS = (
    "route",
    "model_type",
    "status",
    "reason",
    "model_name",
    "limit",
    "plan",
    "decision",
    "adapter",
)


def scrape(stack: Stack, application: str | None = None) -> Counter:
    """Every sample at Ray's Prometheus endpoint, summed over workers and replicas (for the
    gauges that carry their ingress replica: those of one Serve application's, if named)."""
    totals: Counter = Counter()
    text = httpx.get(stack.metrics_url, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            replica = sample.labels.get("replica", "")
            if application is not None and not replica.startswith(f"{application}/"):
                continue
            labels = tuple((k, sample.labels[k]) for k in SERIES_LABELS if k in sample.labels)
            totals[(sample.name, labels)] += sample.value
    return totals


def counted(stack: Stack) -> Counter:
    """The service's counters and histograms, and vLLM's token counter: they move only when
    requests are served (gauges and Ray's own system series move all the time)."""
    return Counter(
        {
            key: value
            for key, value in scrape(stack).items()
            if key[0].startswith(("ray_serviceai_", VLLM_GENERATED)) and key[0] not in GAUGES
        }
    )


def settled(stack: Stack) -> Counter:
    """Ray exports every second (the stack's setting): wait until two reads agree."""
    last = counted(stack)
    for _ in range(20):
        time.sleep(1.5)
        now = counted(stack)
        if now == last:
            return now
        last = now
    raise AssertionError("Ray's metrics never settled")


def series(name: str, **labels: str) -> tuple:
    return (name, tuple((k, labels[k]) for k in SERIES_LABELS if k in labels))


def free_plan_key(stack: Stack) -> str:
    created = serviceai_cli(
        stack.database_url,
        "users",
        "create",
        "--email",
        f"{uuid.uuid4().hex[:10]}@obs.test",
        "--with-key",
        "--json",
    )
    stack.secrets.append(created["key"]["key"])
    return created["key"]["key"]


def test_requests_show_up_at_rays_metrics_endpoint(stack: Stack, client: openai.OpenAI):
    before = settled(stack)
    whole = client.chat.completions.create(model="ServiceAi-Fast", messages=HELLO, max_tokens=3)
    chunks = list(
        client.chat.completions.create(
            model="ServiceAi-Coder",
            messages=HELLO,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = chunks[-1].usage
    auth = {"Authorization": f"Bearer {stack.api_key}"}
    out_of_range = {"model": "ServiceAi-Fast", "messages": HELLO, "temperature": 5}
    assert httpx.post(stack.origin + CHAT, headers=auth, json=out_of_range).status_code == 400
    refused = {"Authorization": f"Bearer {keygen.issue().secret}"}
    well_formed = {"model": "ServiceAi-Fast", "messages": HELLO}
    assert httpx.post(stack.origin + CHAT, headers=refused, json=well_formed).status_code == 401
    free = {"Authorization": f"Bearer {free_plan_key(stack)}"}
    one_token = {"model": "ServiceAi-Pro", "messages": HELLO, "max_tokens": 1}
    statuses = [
        httpx.post(stack.origin + CHAT, headers=free, json=one_token, timeout=60).status_code
        for _ in range(FREE_PRO_RPM + 1)
    ]
    assert statuses == [200] * FREE_PRO_RPM + [429]

    chat = {"route": CHAT}
    expected = {
        series(REQUESTS, **chat, model_type="ServiceAi-Fast", status="200"): 1,
        series(REQUESTS, **chat, model_type="ServiceAi-Coder", status="200"): 1,
        series(REQUESTS, **chat, model_type="none", status="400"): 1,
        series(REQUESTS, **chat, model_type="none", status="401"): 1,
        series(REQUESTS, **chat, model_type="ServiceAi-Pro", status="429"): 1,
        series(
            RATE_LIMITED, model_type="ServiceAi-Pro", limit="requests_per_minute", plan="free"
        ): 1,
        series(AUTH_FAILURES, reason="unknown"): 1,
        series(TTFT_COUNT, model_type="ServiceAi-Coder"): 1,
        series(TTFT_COUNT, model_type="ServiceAi-Fast"): 0,
        series(DURATION_COUNT, model_type="ServiceAi-Fast"): 1,
        series(DURATION_COUNT, model_type="ServiceAi-Coder"): 1,
        series(PROMPT, model_type="ServiceAi-Fast"): whole.usage.prompt_tokens,
        series(COMPLETION, model_type="ServiceAi-Fast"): whole.usage.completion_tokens,
        series(PROMPT, model_type="ServiceAi-Coder"): streamed.prompt_tokens,
        series(COMPLETION, model_type="ServiceAi-Coder"): streamed.completion_tokens,
        # vLLM's own engine metrics, through its Ray stat logger, per model type.
        series(VLLM_GENERATED, model_name="ServiceAi-Fast"): whole.usage.completion_tokens,
        series(VLLM_GENERATED, model_name="ServiceAi-Coder"): streamed.completion_tokens,
    }
    # Each ingress replica writes its gauges every second; none is sending or waiting now.
    idle = {series(gauge, model_type="ServiceAi-Coder"): 0 for gauge in GAUGES}
    deadline = time.monotonic() + 30
    while True:
        after = scrape(stack)
        grown = {key: after[key] - before[key] for key in expected}
        gauges = {key: after.get(key) for key in idle}
        if (grown, gauges) == (expected, idle) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert grown == expected
    assert gauges == idle


def test_grafana_dashboard_reads_only_series_the_service_exports(stack: Stack, client):
    list(
        client.chat.completions.create(
            model="ServiceAi-Pro", messages=HELLO, max_tokens=2, stream=True
        )
    )
    httpx.get(f"{stack.base_url}/models", headers={"Authorization": "Bearer nope"})
    free = {"Authorization": f"Bearer {free_plan_key(stack)}"}
    one_token = {"model": "ServiceAi-Pro", "messages": HELLO, "max_tokens": 1}
    for _ in range(FREE_PRO_RPM + 1):  # the last one is a 429: a rate-limit series appears
        httpx.post(stack.origin + CHAT, headers=free, json=one_token, timeout=60)
    wanted = metric_names(json.loads(DASHBOARD.read_text()))
    deadline = time.monotonic() + 30
    while True:
        exported = {name for name, _ in scrape(stack)}
        missing = {n for n in wanted if not exported & {n, f"{n}_bucket", f"{n}_total"}}
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not missing


def access_lines(stack: Stack, request_id: str, timeout_s: float = 15) -> list[dict]:
    """The JSON lines of the ingress replica's Serve log that carry `request_id`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [
            json.loads(line)
            for path in Path(stack.ray_dir).rglob("replica_serviceai_Ingress_*.log")
            for line in path.read_text(errors="replace").splitlines()
            if request_id in line
        ]
        if any(line.get("message") == "request" for line in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_a_request_id_is_echoed_and_in_every_log_line_of_its_request(
    stack: Stack, http: httpx.Client
):
    request_id = f"obs-{uuid.uuid4()}"
    with http.stream(
        "POST",
        CHAT,
        headers={"x-request-id": request_id},
        json={
            "model": "ServiceAi-Coder",
            "messages": HELLO,
            "max_tokens": 5,
            "ignore_eos": True,
            "stream": True,
        },
    ) as response:
        assert response.headers["x-request-id"] == request_id
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"

    lines = access_lines(stack, request_id)
    assert lines and all(line["request_id"] == request_id for line in lines)
    [access] = [line for line in lines if line["message"] == "request"]
    key_id = http.get("/v1/account/keys").json()["data"][0]["id"]
    fields = ("method", "path", "model_type", "status", "stream", "key_id")
    assert {k: access[k] for k in fields} == {
        "method": "POST",
        "path": CHAT,
        "model_type": "ServiceAi-Coder",
        "status": 200,
        "stream": True,
        "key_id": key_id,
    }
    assert access["prompt_tokens"] > 0 and access["completion_tokens"] == 5
    assert 0 < access["ttft_ms"] <= access["duration_ms"]
    assert "asctime" in access
    assert stack.api_key not in json.dumps(lines) and "Hello there" not in json.dumps(lines)


def test_an_insane_or_missing_request_id_is_replaced(http: httpx.Client):
    for given in ("x" * 300, "has spaces in it", None):
        headers = {} if given is None else {"x-request-id": given}
        response = http.get("/v1/models", headers=headers)
        assert response.status_code == 200
        assert uuid.UUID(response.headers["x-request-id"])
        assert len(response.headers.get_list("x-request-id")) == 1


def test_a_model_replica_keeps_logging_after_its_engine_starts(stack: Stack):
    """vLLM's logging set-up closed the replica's Serve log (deployments/replica_log.py)."""
    for model in ("ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder"):
        logs = [p for p in stack.log_files() if p.name.startswith(f"replica_serviceai_{model}_")]
        assert any("ready: max_model_len=" in p.read_text(errors="replace") for p in logs), model
