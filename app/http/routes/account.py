"""/v1/account: a key holder's own account and keys (the API behind an "API keys" page)."""

from __future__ import annotations

from datetime import date

from fastapi import APIRouter, Depends, Query, Request

from app.accounts.auth import Caller, authenticate
from app.accounts.keystore.schemas import (
    MAX_PAGE,
    ApiKey,
    ApiKeyCreate,
    IssuedApiKey,
    Page,
    UsageList,
    User,
)
from app.openai.protocol import ErrorResponse

router = APIRouter(
    prefix="/v1/account",
    tags=["account"],
    responses={status: {"model": ErrorResponse} for status in (400, 401, 404, 409, 503)},
)


@router.get("", response_model=User)
async def get_account(request: Request, caller: Caller = Depends(authenticate)) -> User:
    return await request.app.state.store.get_user(caller.user_id)


@router.get("/keys", response_model=Page[ApiKey])
async def list_keys(
    request: Request,
    caller: Caller = Depends(authenticate),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
    after: str | None = Query(None, description="The id of the last key of the previous page."),
) -> Page[ApiKey]:
    """The caller's keys, revoked ones included; never their secrets."""
    return await request.app.state.store.list_keys(caller.user_id, limit=limit, after=after)


@router.post("/keys", status_code=201, response_model=IssuedApiKey)
async def create_key(
    request: Request, body: ApiKeyCreate | None = None, caller: Caller = Depends(authenticate)
) -> IssuedApiKey:
    """A new key for the caller. The secret `key` is in this response only."""
    return await request.app.state.store.create_key(caller.user_id, (body or ApiKeyCreate()).name)


@router.delete("/keys/{key_id}", response_model=ApiKey)
async def revoke_key(
    key_id: str, request: Request, caller: Caller = Depends(authenticate)
) -> ApiKey:
    """Revoke one of the caller's keys (the one in use too); the others keep working."""
    return await request.app.state.keys.revoke(key_id, owner_id=caller.user_id)


@router.get("/usage", response_model=UsageList)
async def get_usage(
    request: Request,
    caller: Caller = Depends(authenticate),
    start_date: date | None = Query(None, description="First UTC day (default: 29 days back)."),
    end_date: date | None = Query(None, description="Last UTC day (default: today)."),
) -> UsageList:
    """The caller's usage per key, model type and UTC day (written every few seconds)."""
    return await request.app.state.store.usage(
        user=caller.user_id, start=start_date, end=end_date
    )
