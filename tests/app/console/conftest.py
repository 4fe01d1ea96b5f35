"""The console in-process (httpx over ASGI, cookies kept) on a real key store."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import httpx
import pytest
from ray.exceptions import RayActorError

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.config.settings import Settings
from app.console import mount_console
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from tests.app.conftest import shipped_limits
from tests.app.serve_fakes import serve_response

PASSWORD = "correct horse battery"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def console_settings(**overrides: object) -> Settings:
    fields = {
        "session_secret": "s" * 40,
        "sign_in_limit_per_email": "3/minute",
        "sign_in_limit_per_address": "10/minute",
        "public_base_url": "http://127.0.0.1:8123/v1",
    }
    return Settings(**{**fields, **overrides})


def csrf_of(page: httpx.Response) -> str:
    return _CSRF.search(page.text).group(1)


class Browser:
    """A client that behaves like a browser on the console: it reads each form's CSRF token."""

    def __init__(self, client: httpx.AsyncClient, app: object = None) -> None:
        self.client = client
        self.app = app

    async def get(self, path: str) -> httpx.Response:
        return await self.client.get(f"/console{path}")

    async def submit(self, page: str, action: str, **fields: str) -> httpx.Response:
        """Load `page`, then POST its form to `action` with the token that page carried."""
        token = csrf_of(await self.get(page))
        return await self.client.post(f"/console{action}", data={"csrf_token": token, **fields})

    async def sign_up(self, email: str, password: str = PASSWORD) -> httpx.Response:
        return await self.submit(
            "/sign-up", "/sign-up", email=email, password=password, password_again=password
        )

    async def sign_in(self, email: str, password: str = PASSWORD) -> httpx.Response:
        return await self.submit("/sign-in", "/sign-in", email=email, password=password)


BrowserFactory = Callable[..., Browser]
MODEL_TYPES = ["ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder"]


class _NoModel:
    """Stands in for a model type's deployment handle where nothing is generated: no
    replica answers (the pages that show a context length show none)."""

    def __init__(self) -> None:
        self.info = SimpleNamespace(remote=lambda: serve_response(answer=RayActorError()))

    def options(self, **_: object) -> _NoModel:
        return self


@pytest.fixture
async def new_browser(store: KeyStore) -> AsyncIterator[BrowserFactory]:
    """Browsers on one API + console; `new_browser(**settings)` for other settings."""
    clients: list[httpx.AsyncClient] = []
    verifier = KeyVerifier(store)
    # The pages only list the model types; no page calls a model.
    models = ModelEndpoints({name: _NoModel() for name in MODEL_TYPES}, created=0)

    def make(**overrides: object) -> Browser:
        api = create_api(models, verifier, shipped_limits(), UsageMeter(store))
        mount_console(api, console_settings(**overrides))
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        client = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8123")
        clients.append(client)
        return Browser(client, api)

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def browser(new_browser: BrowserFactory) -> Browser:
    return new_browser()
