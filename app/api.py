"""The FastAPI application: routes, error envelope and the state they share."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from app.auth import KeyVerifier
from app.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from app.cors import install_cors
from app.dispatch import ModelRouter
from app.errors import ApiError, install_error_handlers
from app.keystore.errors import KeyStoreError
from app.ratelimit import RateLimits
from app.observability.metrics import InFlight
from app.observability.request_record import ObservedRequests
from app.routes import account, admin, chat, health
from app.routes import models as model_routes
from app.usage_meter import UsageMeter

STORE_RETRY_AFTER_S = 2


def create_api(
    models: ModelRouter,
    keys: KeyVerifier,
    limits: RateLimits,
    usage: UsageMeter,
    admin_token: SecretStr | None = None,
    in_flight: InFlight | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    cors_origins: Sequence[str] = (),
) -> FastAPI:
    """Build the HTTP API around a model router, a key verifier, the plans' rate limits and the
    usage meter; /admin only with a token."""
    api = FastAPI(
        title="ServiceAi",
        summary="OpenAI-compatible chat completions over logical model types.",
        version="1.0.0",
    )
    api.state.models = models
    api.state.keys = keys
    api.state.store = keys.store
    api.state.limits = limits
    api.state.usage = usage
    install_error_handlers(api)
    api.add_exception_handler(KeyStoreError, _store_error)
    install_cors(api, cors_origins)
    api.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    # Outermost, so that refusals of the inner layers (413, CORS) are counted and logged too.
    api.add_middleware(ObservedRequests, in_flight=in_flight or InFlight())
    api.include_router(health.router)
    api.include_router(model_routes.router)
    api.include_router(chat.router)
    api.include_router(account.router)
    if admin_token is not None:
        api.state.admin_token = admin_token.get_secret_value().encode()
        api.include_router(admin.router)
    return api


def _store_error(request: Request, exc: KeyStoreError) -> JSONResponse:
    unavailable = exc.status >= 500
    return ApiError(
        exc.status,
        exc.message,
        type="server_error" if unavailable else "invalid_request_error",
        param=exc.param,
        code=exc.code,
        headers={"Retry-After": str(STORE_RETRY_AFTER_S)} if unavailable else None,
    ).response()
