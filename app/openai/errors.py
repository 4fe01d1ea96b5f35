"""The OpenAI error envelope, and the handlers that put every failure into it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ExceptionHandler

from app.anthropic import envelope
from app.observability import request_id

E = TypeVar("E", bound=Exception)

logger = logging.getLogger("ray.serve.serviceai")


class ApiError(Exception):
    """A failure with the status, OpenAI `type`/`code`/`param` and headers the client gets."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self, path: str = "") -> JSONResponse:
        """The error as a client of the API at `path` (below the app's prefix) reads it:
        OpenAI's envelope, or under /v1/messages Anthropic's (app.anthropic.envelope)."""
        if envelope.speaks_anthropic(path):
            status = envelope.status_of(self.status)
            return JSONResponse(
                envelope.error_body(status, envelope.naming(self.message, self.param)),
                status_code=status,
                headers=envelope.headers_of(self.headers),
            )
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def request_id_of(request: Request) -> str:
    """The id Ray Serve's proxy gave this request (the client's x-request-id where it is sane:
    app.observability.request_id replaces any other before it gets here)."""
    given = request.headers.get(request_id.HEADER, "")
    return given if request_id.is_sane(given) else "unknown"


# Names pydantic puts in an error location for the branch of a union, not for a field.
_UNION_BRANCHES = {"str", "int", "float", "bool", "bytes", "none", "dict", "list", "json-or-python"}


def _param_path(loc: Sequence[Any]) -> str | None:
    """('body', 'messages', 0, 'role') -> 'messages[0].role'; union branch names are dropped."""
    path = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _is_field_name(part):
            path += f".{part}" if path else part
    return path or None


def _is_field_name(part: Any) -> bool:
    return (
        isinstance(part, str)
        and part[:1].islower()
        and part not in _UNION_BRANCHES
        and not any(c in part for c in "[-")
    )


JSON_INVALID = (
    "We could not parse the JSON body of your request. The body must be valid JSON in UTF-8 "
    "(check quoting, commas and brackets)."
)


def _validation_message(error: Mapping[str, Any], param: str | None) -> str:
    kind = error.get("type", "")
    if kind == "json_invalid":
        return JSON_INVALID
    if kind == "missing":
        return f"Missing required parameter: '{param}'."
    message = str(error.get("msg", "Invalid value."))
    message = message.removeprefix("Value error, ")
    if param is None:
        return f"Invalid request body: {message}."
    return f"Invalid value for '{param}': {message}."


def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A 400 naming the first thing wrong with the request (only the first is reported)."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    param = _param_path(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        param = None
    code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
    message = _validation_message(first, param)
    content_type = request.headers.get("content-type", "")
    if param is None and content_type and "json" not in content_type:
        message = (
            f"The request body must be JSON sent with 'Content-Type: application/json' "
            f"(got '{content_type[:100]}')."
        )
    return ApiError(400, message, param=param, code=code).response(api_path(request))


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"Invalid URL ({request.method} {request.url.path})."
        code = "unknown_url"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}."
        code = "method_not_allowed"
    elif exc.status_code == 400 and exc.__cause__ is not None:
        # FastAPI's wrapper of a body its JSON decoder choked on (invalid UTF-8, nesting depth).
        message, code = JSON_INVALID, "invalid_json"
    else:
        message, code = str(exc.detail), None
    return ApiError(
        exc.status_code, message, code=code, headers=getattr(exc, "headers", None)
    ).response(api_path(request))


def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    request_id = request_id_of(request)
    logger.error(
        "Unhandled error in %s %s (request %s)",
        request.method,
        request.url.path,
        request_id,
        exc_info=exc,
    )
    return ApiError(
        500,
        "The server had an error while processing your request. "
        f"Retry, or contact us and quote request id {request_id}.",
        type="server_error",
        code="internal_error",
    ).response(api_path(request))


def api_path(request: Request) -> str:
    """The request's path below the app's own prefix (a Serve route_prefix is the root_path)."""
    return request.scope["path"].removeprefix(request.scope.get("root_path", ""))


def handle(app: Starlette, exception: type[E], handler: Callable[[Request, E], Any]) -> None:
    """`handler` answers `exception` (Starlette types every handler as taking any Exception)."""
    app.add_exception_handler(exception, cast(ExceptionHandler, handler))


def install_error_handlers(app: FastAPI) -> None:
    handle(app, ApiError, lambda request, exc: exc.response(api_path(request)))
    handle(app, RequestValidationError, validation_error)
    handle(app, StarletteHTTPException, _http_error)
    handle(app, Exception, _unexpected_error)
