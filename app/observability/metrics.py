"""The series the ingress exports through Ray's metrics API (scraped at Ray's Prometheus port).

Ray prefixes every name with `ray_` and counters get `_total`: `serviceai_requests` is
scraped as `ray_serviceai_requests_total`. Labels are bounded: model type, status, route,
plan, limit, reason; never a key, user or request id. Each call costs 8-25 us (measured on
this machine), so a request records a handful of them once, when it ends; the two gauges are
written by a once-a-second task, not per request.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter as Tally

from ray import serve
from ray.serve.exceptions import RayServeException
from ray.util.metrics import Counter, Gauge, Histogram

NO_MODEL = "none"
"""The model_type label of a request that never reached a model type (refused before)."""

GAUGE_PERIOD_S = 1.0

REQUESTS = Counter(
    "serviceai_requests",
    description="Requests answered, by route, model type and status (for a stream that failed "
    "after it began: the status of its error event; 499: the client went away).",
    tag_keys=("route", "model_type", "status"),
)
TIME_TO_FIRST_TOKEN = Histogram(
    "serviceai_time_to_first_token_seconds",
    description="From the request's arrival to the first generated token, streamed requests.",
    boundaries=[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    tag_keys=("model_type",),
)
REQUEST_DURATION = Histogram(
    "serviceai_request_duration_seconds",
    description="From the request's arrival to its last byte, chat completions.",
    boundaries=[0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
    tag_keys=("model_type",),
)
PROMPT_TOKENS = Counter(
    "serviceai_prompt_tokens",
    description="Prompt tokens of answered chat completions.",
    tag_keys=("model_type",),
)
COMPLETION_TOKENS = Counter(
    "serviceai_completion_tokens",
    description="Generated tokens sent to clients.",
    tag_keys=("model_type",),
)
# Ray exports one value per label set of a gauge (the first worker's: it drops the worker id),
# so each ingress replica's gauges carry the replica, or replicas would hide each other's.
ACTIVE_STREAMS = Gauge(
    "serviceai_active_streams",
    description="Streams this ingress replica is sending right now.",
    tag_keys=("model_type", "replica"),
)
QUEUE_DEPTH = Gauge(
    "serviceai_queue_depth",
    description="Requests this ingress replica has sent to a model type that wait for their "
    "first token (whole replies: for their result).",
    tag_keys=("model_type", "replica"),
)
RATE_LIMITED = Counter(
    "serviceai_rate_limited",
    description="Requests refused with 429, by the limit they hit.",
    tag_keys=("limit", "plan", "model_type"),
)
AUTHENTICATION_FAILURES = Counter(
    "serviceai_authentication_failures",
    description="Requests refused with 401, by reason.",
    tag_keys=("reason",),
)


def rate_limited(limit: str, plan: str, model_type: str = NO_MODEL) -> None:
    """Count a 429. `limit` names the limit (e.g. 'requests_per_minute'), from a fixed set."""
    RATE_LIMITED.inc(1, {"limit": limit, "plan": plan, "model_type": model_type})


def authentication_failed(reason: str) -> None:
    """Count a 401; `reason` is one of a fixed set (missing, malformed, unknown, revoked...)."""
    AUTHENTICATION_FAILURES.inc(1, {"reason": reason})


class InFlight:
    """Per model type: requests waiting for their first token, and open streams.

    Plain integers on the request path; `publish` copies them into the gauges.
    """

    def __init__(self) -> None:
        self.waiting: Tally[str] = Tally()
        self.streaming: Tally[str] = Tally()
        self._replica: str | None = None

    def publish(self) -> None:
        if self._replica is None:
            self._replica = replica_label()
        for model_type in self.waiting.keys() | self.streaming.keys():
            tags = {"model_type": model_type, "replica": self._replica}
            QUEUE_DEPTH.set(self.waiting[model_type], tags)
            ACTIVE_STREAMS.set(self.streaming[model_type], tags)

    async def publish_periodically(self, period_s: float = GAUGE_PERIOD_S) -> None:
        while True:
            self.publish()
            await asyncio.sleep(period_s)


def replica_label() -> str:
    """This ingress replica as a gauge's `replica` label: its application and Serve's id for it
    ("serviceai/abc123"); the process id outside Serve (tests)."""
    try:
        context = serve.get_replica_context()
    except RayServeException:
        return f"pid-{os.getpid()}"
    return f"{context.app_name}/{context.replica_id.unique_id}"
