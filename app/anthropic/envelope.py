"""Anthropic's error envelope: what a failure of /v1/messages looks like to Anthropic's clients.

Every failure is first an `ApiError` (status, message, OpenAI code), the same fault the same
error on every API; under /v1/messages it goes out as Anthropic writes it:
`{"type": "error", "error": {"type": ..., "message": ...}}`, with Anthropic's statuses (529 for
a type that is overloaded or has no replica now) and, beside OpenAI's `x-ratelimit-*`,
Anthropic's `anthropic-ratelimit-*` headers, so that the SDKs raise their own classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREFIX = "/v1/messages"
OVERLOADED = 529
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}
_LIMIT_HEADERS = {
    "x-ratelimit-limit-requests": "anthropic-ratelimit-requests-limit",
    "x-ratelimit-remaining-requests": "anthropic-ratelimit-requests-remaining",
    "x-ratelimit-limit-tokens": "anthropic-ratelimit-tokens-limit",
    "x-ratelimit-remaining-tokens": "anthropic-ratelimit-tokens-remaining",
}


def speaks_anthropic(path: str) -> bool:
    """Whether a request to `path` (below the app's own prefix) gets Anthropic's envelope."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def status_of(status: int) -> int:
    """Anthropic's status for ours: a type with no room or no replica now is 529."""
    return OVERLOADED if status == 503 else status


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's body for an error of Anthropic's `status`."""
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def naming(message: str, param: str | None) -> str:
    """The message, led by the field it is about where it does not name it (Anthropic's
    envelope has no `param`; its own messages begin so: "max_tokens: Field required")."""
    return message if param is None or param in message else f"{param}: {message}"


def headers_of(headers: Mapping[str, str]) -> dict[str, str]:
    """The error's headers, with Anthropic's names for the rate-limit ones added."""
    named = dict(headers)
    for ours, theirs in _LIMIT_HEADERS.items():
        if ours in headers:
            named[theirs] = headers[ours]
    return named
