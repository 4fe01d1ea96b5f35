"""/v1/account: a key holder's own account and keys (the API behind an "API keys" page)."""

from __future__ import annotations

from datetime import date, timedelta

from fastapi import APIRouter, Depends, Query, Request

from app.accounts.auth import Caller, authenticate
from app.accounts.keystore.schemas import (
    MAX_PAGE,
    ApiKey,
    ApiKeyCreate,
    ApiKeyRotate,
    ApiKeyUpdate,
    IssuedApiKey,
    KeyScopes,
    Order,
    Page,
    UsageList,
    User,
)
from app.accounts.scopes import (
    check_may_manage,
    check_may_mint,
    check_models,
    check_narrower,
    narrowest,
)
from app.openai.protocol import ErrorResponse

router = APIRouter(
    prefix="/v1/account",
    tags=["account"],
    responses={status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 409, 503)},
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
    order: Order = Query("asc", description="asc: oldest first; desc: newest first."),
) -> Page[ApiKey]:
    """The caller's keys, revoked ones included; never their secrets. A key that may not
    manage keys lists none."""
    check_may_manage(caller.scopes(), "list keys")
    return await request.app.state.store.list_keys(
        caller.user_id, limit=limit, after=after, order=order
    )


@router.post("/keys", status_code=201, response_model=IssuedApiKey)
async def create_key(
    request: Request, body: ApiKeyCreate | None = None, caller: Caller = Depends(authenticate)
) -> IssuedApiKey:
    """A new key for the caller, with the scopes given: at most those of the key in use, which
    must manage keys and have no limits of its own. The secret `key` is in this response only."""
    body = body or ApiKeyCreate()
    check_may_mint(caller.scopes(), "create keys")
    check_models(body, request.app.state.models.names)
    check_narrower(caller.scopes(), body, "the key in use")
    return await request.app.state.store.create_key(caller.user_id, body.name, body)


@router.patch("/keys/{key_id}", response_model=ApiKey)
async def update_key(
    key_id: str, body: ApiKeyUpdate, request: Request, caller: Caller = Depends(authenticate)
) -> ApiKey:
    """Narrow one of the caller's keys: a field sent replaces it, one left out stays; a change
    that would let the key (or a key made by the key in use) do more is refused. Another key
    than the one in use needs a key that manages keys."""
    store = request.app.state.store
    if key_id != caller.key_id:
        check_may_manage(caller.scopes(), "change other keys")
    check_models(body, request.app.state.models.names)
    current = await store.get_key(key_id, owner_id=caller.user_id)
    scopes = KeyScopes.model_validate(
        {
            **current.model_dump(include=set(KeyScopes.model_fields)),
            **body.model_dump(include=body.model_fields_set),
        }
    )
    check_narrower(current, scopes, "the key has now")
    check_narrower(caller.scopes(), scopes, "the key in use")
    updated = await store.update_key(
        key_id, body.model_dump(include=body.model_fields_set), owner_id=caller.user_id
    )
    request.app.state.keys.forget(key_id=key_id)
    return updated


@router.post("/keys/{key_id}/rotate", status_code=201, response_model=IssuedApiKey)
async def rotate_key(
    key_id: str,
    request: Request,
    body: ApiKeyRotate | None = None,
    caller: Caller = Depends(authenticate),
) -> IssuedApiKey:
    """A new key with the same name and the scopes the key in use covers (never wider than
    it); the old one works for `grace_seconds` more, then is revoked. The key in use must be
    one that may create keys. The new secret is in this response only."""
    grace = timedelta(seconds=(body or ApiKeyRotate()).grace_seconds)
    ceiling = caller.scopes()
    check_may_mint(ceiling, "rotate keys")
    store = request.app.state.store
    issued = await store.rotate_key(
        key_id,
        grace,
        owner_id=caller.user_id,
        scopes=lambda old: narrowest(old, ceiling),
    )
    request.app.state.keys.forget(key_id=key_id)
    return issued


@router.delete("/keys/{key_id}", response_model=ApiKey)
async def revoke_key(
    key_id: str, request: Request, caller: Caller = Depends(authenticate)
) -> ApiKey:
    """Revoke one of the caller's keys (the one in use too); the others keep working. Another
    key than the one in use needs a key that manages keys."""
    if key_id != caller.key_id:
        check_may_manage(caller.scopes(), "revoke other keys")
    return await request.app.state.keys.revoke(key_id, owner_id=caller.user_id)


@router.get("/usage", response_model=UsageList)
async def get_usage(
    request: Request,
    caller: Caller = Depends(authenticate),
    start_date: date | None = Query(None, description="First UTC day (default: 29 days back)."),
    end_date: date | None = Query(None, description="Last UTC day (default: today)."),
) -> UsageList:
    """The caller's usage per key, model type and UTC day (written every few seconds)."""
    return await request.app.state.store.usage(user=caller.user_id, start=start_date, end=end_date)
