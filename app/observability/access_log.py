"""One structured line per request, written when its response (stream included) has ended.

The logger is a child of Ray Serve's `ray.serve`: the line lands in the ingress replica's
Serve log, which the ingress writes as JSON (`logging_config` in app/config/service.py), and Ray adds
the request id, route, application and replica. The fields below are the line's own; no
message content, never the key (its id only).
"""

from __future__ import annotations

import logging

logger = logging.getLogger("ray.serve.serviceai.access")

MESSAGE = "request"


def write(
    *,
    request_id: str,
    method: str,
    route: str,
    model_type: str | None,
    status: int,
    stream: bool,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    ttft_ms: float | None,
    duration_ms: float,
    key_id: str | None,
) -> None:
    logger.info(
        MESSAGE,
        extra={
            "request_id": request_id,
            "method": method,
            "path": route,
            "model_type": model_type,
            "status": status,
            "stream": stream,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "ttft_ms": ttft_ms,
            "duration_ms": duration_ms,
            "key_id": key_id,
        },
    )
