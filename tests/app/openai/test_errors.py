import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from app.openai.errors import ApiError, _param_path, install_error_handlers


class Body(BaseModel):
    name: str
    items: list[int]


def make_app() -> FastAPI:
    api = FastAPI()
    install_error_handlers(api)

    @api.post("/echo")
    async def echo(body: Body) -> Body:
        return body

    @api.get("/teapot")
    async def teapot() -> None:
        raise ApiError(418, "I am a teapot.", code="teapot", headers={"Retry-After": "3"})

    @api.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internal detail at /srv/app/x.py")

    return api


@pytest.fixture
async def client():
    transport = httpx.ASGITransport(app=make_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


def envelope(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("body", "messages", 0, "role"), "messages[0].role"),
        (("body", "stop", "list[str]", 4), "stop[4]"),
        (("body", "messages", 2, "content", "str"), "messages[2].content"),
        (("body",), None),
        (("temperature",), "temperature"),
    ],
)
def test_param_paths(loc, param):
    assert _param_path(loc) == param


async def test_malformed_json_is_400(client):
    response = await client.post(
        "/echo", content=b'{"name": ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = envelope(response)
    assert error["type"] == "invalid_request_error" and error["param"] is None
    assert "JSON" in error["message"]


@pytest.mark.parametrize(
    "body", [b'{"name": "\xff\xfe", "items": []}', b'{"name": "x", "items": ' + b"[" * 100_000]
)
async def test_undecodable_or_too_deep_json_is_400_about_json(client, body):
    response = await client.post(
        "/echo", content=body, headers={"content-type": "application/json"}
    )
    error = envelope(response)
    assert (
        response.status_code == 400 and "JSON" in error["message"] and "UTF-8" in error["message"]
    )


async def test_missing_field_names_it(client):
    response = await client.post("/echo", json={"items": [1]})
    assert response.status_code == 400
    assert envelope(response) == {
        "message": "Missing required parameter: 'name'.",
        "type": "invalid_request_error",
        "param": "name",
        "code": "missing_required_parameter",
    }


async def test_wrong_type_names_the_element(client):
    error = envelope(await client.post("/echo", json={"name": "a", "items": [1, "x"]}))
    assert error["param"] == "items[1]"
    assert error["message"].startswith("Invalid value for 'items[1]'")


async def test_form_body_says_json_is_needed(client):
    response = await client.post("/echo", data={"name": "a"})
    assert response.status_code == 400
    assert "application/json" in envelope(response)["message"]


async def test_api_error_keeps_status_code_and_headers(client):
    response = await client.get("/teapot")
    assert response.status_code == 418
    assert response.headers["retry-after"] == "3"
    assert envelope(response)["code"] == "teapot"


async def test_unknown_route_and_method(client):
    response = await client.get("/nope")
    assert (
        response.status_code == 404 and envelope(response)["message"] == "Invalid URL (GET /nope)."
    )
    response = await client.get("/echo")
    assert response.status_code == 405 and envelope(response)["code"] == "method_not_allowed"


async def test_unexpected_error_is_500_without_internals(client):
    response = await client.get("/boom", headers={"x-request-id": "req-123"})
    assert response.status_code == 500
    error = envelope(response)
    assert error["type"] == "server_error"
    assert "req-123" in error["message"]
    assert (
        "secret" not in response.text
        and "Traceback" not in response.text
        and "/srv" not in response.text
    )
