"""Ray Serve's HTTP callback checks a client's x-request-id before Serve adopts it."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from app.observability.request_id import MAX_LENGTH, http_middlewares, is_sane
from app.serving.ray_runtime import SERVE_ENV


@pytest.mark.parametrize(
    "value",
    ["abc", "4f1c2d3e-aaaa-4bbb-8ccc-0123456789ab", "trace:1/2@svc+x=y_z.w", "a" * MAX_LENGTH],
)
def test_sane_ids_are_kept(value: str):
    assert is_sane(value)


@pytest.mark.parametrize(
    "value", ["", "a" * (MAX_LENGTH + 1), "two words", "x\ty", "é", 'a"b', "{}"]
)
def test_other_ids_are_not(value: str):
    assert not is_sane(value)


def seen_id(request: Request) -> PlainTextResponse:
    return PlainTextResponse(request.headers.get("x-request-id", "<none>"))


@pytest.fixture
async def client():
    app = Starlette(routes=[Route("/", seen_id)], middleware=http_middlewares())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c


async def test_an_insane_id_is_replaced_before_the_app_sees_it(client: httpx.AsyncClient):
    replaced = (await client.get("/", headers={"x-request-id": "x" * 500})).text
    assert is_sane(replaced) and len(replaced) == 36
    assert (await client.get("/", headers={"x-request-id": "mine-1"})).text == "mine-1"
    # No id at all is Ray's to make (its middleware runs next), not this one's.
    assert (await client.get("/")).text == "<none>"


def test_ray_serve_is_told_to_use_it():
    module, _, name = SERVE_ENV["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"].partition(":")
    assert (module, name) == ("app.observability.request_id", "http_middlewares")
