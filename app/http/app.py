"""The FastAPI application: routes, error envelope and the state they share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from app.accounts.auth import AuthenticateFirst, KeyVerifier, store_error
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.responses import ResponseStore
from app.apis.chat import route as chat
from app.apis.completions import route as completions
from app.apis.embeddings import route as embeddings
from app.apis.messages import route as messages
from app.apis.responses import route as responses
from app.http.body_limit import DEFAULT_BODY_READ_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, BodyLimit
from app.http.cors import install_cors
from app.http.routes import account, admin, health
from app.http.routes import models as model_routes
from app.limits.admission import RateLimits
from app.limits.usage_meter import UsageMeter
from app.observability.metrics import InFlight
from app.observability.request_record import ObservedRequests
from app.openai.errors import api_path, handle, install_error_handlers, validation_error
from app.serving.adapters import RegisteredAdapters
from app.serving.endpoints import ModelEndpoints
from app.version import VERSION

_NO_DOCS: dict[str, Any] = {"docs_url": None, "redoc_url": None, "openapi_url": None}


def create_api(
    models: ModelEndpoints,
    keys: KeyVerifier,
    limits: RateLimits,
    usage: UsageMeter,
    admin_token: SecretStr | None = None,
    in_flight: InFlight | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S,
    cors_origins: Sequence[str] = (),
    api_docs: bool = True,
    response_store: ResponseStore | None = None,
    adapters: RegisteredAdapters | None = None,
    migration_attempts: int = 2,
) -> FastAPI:
    """Build the HTTP API around a model router, a key verifier, the plans' rate limits and the
    usage meter; /admin only with a token, /docs and /openapi.json only with `api_docs`."""
    api = FastAPI(
        title="ServiceAi",
        summary="OpenAI-compatible chat completions over logical model types.",
        version=VERSION,
        **({} if api_docs else _NO_DOCS),
    )
    api.state.models = models
    api.state.keys = keys
    api.state.store = keys.store
    api.state.limits = limits
    api.state.usage = usage
    api.state.responses = response_store or ResponseStore(keys.store.database)
    api.state.adapters = adapters or RegisteredAdapters(keys.store)
    api.state.migration_attempts = migration_attempts
    install_error_handlers(api)
    handle(api, KeyStoreError, _store_error)
    handle(api, RequestValidationError, _refused_body)
    # A stranger's body is never read; a caller's is read within a deadline and a size cap.
    api.add_middleware(AuthenticateFirst, verifier=keys)
    install_cors(api, cors_origins)
    api.add_middleware(BodyLimit, max_body_bytes=max_body_bytes, read_timeout_s=body_read_timeout_s)
    # Outermost, so that refusals of the inner layers (413, CORS) are counted and logged too.
    api.add_middleware(ObservedRequests, in_flight=in_flight or InFlight())
    api.include_router(health.router)
    api.include_router(model_routes.router)
    api.include_router(chat.router)
    api.include_router(completions.router)
    api.include_router(responses.router)
    api.include_router(messages.router)
    api.include_router(embeddings.router)
    api.include_router(account.router)
    if admin_token is not None:
        api.state.admin_token = admin_token.get_secret_value().encode()
        api.include_router(admin.router)
    return api


def _store_error(request: Request, exc: KeyStoreError) -> JSONResponse:
    return store_error(exc).response(api_path(request))


async def _refused_body(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A 400 for the body; an authenticated caller's refusal counts against its request rate."""
    caller = request.scope.get("state", {}).get("caller")
    if caller is not None:
        body = exc.body if isinstance(exc.body, dict) else {}
        await request.app.state.limits.refuse(caller, body.get("model"))
    return validation_error(request, exc)
