"""The account console under /console: a user's API keys, plan and quick-start, as web pages.

A FastAPI app of its own, mounted on the API: its session cookie, CSRF checks and HTML errors
stay off the API's hot path, and it shares the API's key store and key verifier.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Literal

import itsdangerous
from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import SecretStr
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from app.accounts.keystore.errors import KeyStoreError
from app.config.settings import Settings
from app.console import operator_pages, pages
from app.console.client_address import ClientAddress
from app.console.session import CsrfRejected, SignInRequired
from app.console.sign_in_limit import SignInLimit
from app.openai.errors import handle, request_id_of

logger = logging.getLogger("ray.serve.serviceai")

PREFIX = "/console"
SESSION_COOKIE = "serviceai_console"
# Scripts and styles only from the console itself; no framing (revoking by clickjacking).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def mount_console(api: FastAPI, settings: Settings) -> None:
    """Serve the console at /console of `api`, on the same store and key verifier."""
    console = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    console.state.store = api.state.store
    console.state.keys = api.state.keys
    console.state.models = api.state.models
    console.state.limits = api.state.limits
    console.state.base_url = settings.public_base_url
    console.state.sign_up = settings.sign_up
    console.state.client_address = ClientAddress(settings.trusted_proxies)
    console.state.sign_in_limit = SignInLimit(
        settings.sign_in_limit_per_email,
        settings.sign_in_limit_per_address,
        settings.sign_in_limit_shared,
    )
    console.add_middleware(
        RotatingSessionMiddleware,
        previous_secret=settings.session_secret_previous,
        secret_key=_session_secret(settings),
        session_cookie=SESSION_COOKIE,
        max_age=settings.session_idle_s,
        path=PREFIX,
        same_site="lax",
        https_only=settings.public_base_url.startswith("https://"),
    )

    @console.middleware("http")
    async def security_headers(request: Request, call_next) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    console.include_router(pages.router)
    console.include_router(operator_pages.router)
    console.mount(
        "/static", StaticFiles(directory=Path(__file__).resolve().parent / "static"), "static"
    )
    _install_error_pages(console)
    api.mount(PREFIX, console)


class RotatingSessionMiddleware(SessionMiddleware):
    """Starlette's signed-cookie sessions, also reading a cookie signed with the previous
    secret (itsdangerous accepts every key of its list and signs with the last); a session so
    read is signed again with the current secret on that response."""

    def __init__(
        self,
        app: ASGIApp,
        secret_key: str,
        previous_secret: SecretStr | None,
        session_cookie: str,
        max_age: int,
        path: str,
        same_site: Literal["lax", "strict", "none"],
        https_only: bool,
    ) -> None:
        super().__init__(
            self._signing_again(app),
            secret_key,
            session_cookie=session_cookie,
            max_age=max_age,
            path=path,
            same_site=same_site,
            https_only=https_only,
        )
        self.current = self.signer
        if previous_secret is not None:
            keys = [previous_secret.get_secret_value(), secret_key]
            self.signer = itsdangerous.TimestampSigner(keys)

    def _signing_again(self, app: ASGIApp) -> ASGIApp:
        async def signed_with_the_current_secret(scope: Scope, receive: Receive, send: Send):
            session = scope.get("session")
            if session and self.signer is not self.current:
                cookie = HTTPConnection(scope).cookies.get(self.session_cookie, "")
                if not self.current.validate(cookie.encode(), max_age=self.max_age):
                    session.modified = True  # Starlette signs a modified session again
            await app(scope, receive, send)

        return signed_with_the_current_secret


def require_shared_secret(settings: Settings, most_replicas: int) -> None:
    """Refuse to start an ingress of several replicas whose cookies only one could read."""
    if most_replicas > 1 and settings.session_secret is None:
        raise RuntimeError(
            f"The ingress may run {most_replicas} replicas, but SERVICEAI_SESSION_SECRET is "
            "unset: each replica would sign console sessions with a key of its own, so a form "
            "served by one and posted to another fails and users are signed out at random. "
            "Set SERVICEAI_SESSION_SECRET (e.g. `openssl rand -hex 32`) for every replica."
        )


def _session_secret(settings: Settings) -> str:
    if settings.session_secret is not None:
        return settings.session_secret.get_secret_value()
    logger.warning(
        "SERVICEAI_SESSION_SECRET is unset: console sessions are signed with a key of this "
        "process only; they end when it restarts and do not carry over to other replicas."
    )
    return secrets.token_urlsafe(32)


def _install_error_pages(console: FastAPI) -> None:
    def sign_in(request: Request, exc: SignInRequired) -> Response:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/sign-in", 303)

    def csrf(request: Request, exc: CsrfRejected) -> Response:
        return _error(
            request,
            403,
            "This form has expired or did not come from this console. "
            "Reload the page and send it again.",
        )

    def store(request: Request, exc: KeyStoreError) -> Response:
        headers = {"Retry-After": "2"} if exc.status >= 500 else None
        return _error(request, exc.status, exc.message, headers)

    def http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return _error(request, 404, f"There is no page at {request.url.path}.")
        return _error(request, exc.status_code, str(exc.detail))

    def unexpected(request: Request, exc: Exception) -> Response:
        request_id = request_id_of(request)
        logger.error(
            "Unhandled error in %s %s (request %s)",
            request.method,
            request.url.path,
            request_id,
            exc_info=exc,
        )
        return _error(
            request,
            500,
            "Something went wrong on our side. Retry, or contact us and quote "
            f"request id {request_id}.",
        )

    handle(console, SignInRequired, sign_in)
    handle(console, CsrfRejected, csrf)
    handle(console, KeyStoreError, store)
    handle(console, StarletteHTTPException, http)
    handle(console, Exception, unexpected)


def _error(
    request: Request, status: int, message: str, headers: dict[str, str] | None = None
) -> Response:
    return pages.render(request, "error.html", status, headers, code=status, message=message)
