"""What observing a request costs the ingress: request id, record, metrics, access-log line.

    .venv/bin/python bench/observability.py

Times one streamed chat completion's worth of observation (what `ObservedRequests` and the
route's record calls add), in-process around an ASGI app that answers at once, against the
same app without it. The access log goes through Ray's JSON formatter to a file, as in a
replica. Ray is not started here: a metric call then costs ~25 us instead of the ~8-23 us it
costs in a Ray worker, so the figure is an upper bound.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time

from ray._common.formatters import JSONFormatter
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from app.observability import access_log
from app.observability.metrics import InFlight
from app.observability.request_record import ObservedRequests, record_of

START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/plain")],
}
BODY = {"type": "http.response.body", "body": b"data: [DONE]\n\n"}


async def chat_like(scope: Scope, receive: Receive, send: Send) -> None:
    """What the chat route does to its record for one stream, and nothing else."""
    record = record_of(Request(scope))
    if record is not None:
        record.key_id = "key_0123456789abcdef"
        record.sent_to("ServiceAi-Fast", stream=True)
        record.first_token(prompt_tokens=64)
        record.stream_ended(completion_tokens=64, error_status=None)
    await send(START)
    await send(BODY)


async def bare(scope: Scope, receive: Receive, send: Send) -> None:
    await send(START)
    await send(BODY)


async def per_request_us(app, rounds: int) -> list[float]:
    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    async def send(message: dict) -> None:
        pass

    samples = []
    for _ in range(rounds):
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": [(b"x-request-id", b"4f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")],
        }
        started = time.perf_counter_ns()
        await app(scope, receive, send)
        samples.append((time.perf_counter_ns() - started) / 1000)
    return samples


async def main(rounds: int) -> None:
    with tempfile.NamedTemporaryFile(suffix=".log") as log_file:
        handler = logging.FileHandler(log_file.name)
        handler.setFormatter(JSONFormatter())
        access_log.logger.addHandler(handler)
        access_log.logger.setLevel(logging.INFO)
        access_log.logger.propagate = False
        observed = ObservedRequests(chat_like, in_flight=InFlight())
        for name, app in (("bare", bare), ("observed", observed)) * 2:
            samples = await per_request_us(app, rounds)
            print(
                f"{name:9} p50 {statistics.median(samples):7.1f} us  "
                f"mean {statistics.fmean(samples):7.1f} us  ({rounds} requests)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20000)
    asyncio.run(main(parser.parse_args().rounds))
