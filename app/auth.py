"""Bearer-key authentication, as a FastAPI dependency."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from app.errors import ApiError


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: the key's id (never the key itself), its owner and plan."""

    key_id: str
    user_id: str
    plan: str


class DevKeyVerifier:
    """Accepts one key from the environment (SERVICEAI_DEV_API_KEY)."""

    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else None

    async def verify(self, token: str) -> Caller:
        if self._key is None or not hmac.compare_digest(token.encode(), self._key):
            raise invalid_key("The API key is not valid.")
        return Caller(key_id="dev", user_id="dev", plan="free")


def invalid_key(reason: str) -> ApiError:
    return ApiError(
        401,
        f"{reason} Send 'Authorization: Bearer <API_KEY>' with a valid key.",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def authenticate(request: Request) -> Caller:
    header = request.headers.get("authorization")
    if not header:
        raise invalid_key("Missing Authorization header.")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        raise invalid_key("The Authorization header must use the Bearer scheme.")
    token = token.strip()
    if not token:
        raise invalid_key("The Authorization header carries no API key.")
    return await request.app.state.keys.verify(token)
