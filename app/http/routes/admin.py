"""/admin: users and keys for operators, behind the admin token (never a user's key).

Mounted only when SERVICEAI_ADMIN_TOKEN is set; without it the admin API does not exist.
"""

from __future__ import annotations

import hmac
from datetime import date, timedelta

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.accounts.keystore.audit import LAST_ID, Actor
from app.accounts.keystore.schemas import (
    MAX_PAGE,
    Adapter,
    AdapterCreate,
    AdapterList,
    ApiKey,
    ApiKeyCreate,
    ApiKeyRotate,
    ApiKeyUpdate,
    AuditPage,
    IssuedApiKey,
    Order,
    Page,
    UsageList,
    User,
    UserCreate,
    UserUpdate,
)
from app.accounts.scopes import check_models
from app.observability.metrics import authentication_failed
from app.openai.errors import ApiError
from app.openai.protocol import ErrorResponse
from app.serving.adapters import check_adapter_path, check_registrable

_admin_bearer = HTTPBearer(
    auto_error=False, scheme_name="AdminToken", description="The SERVICEAI_ADMIN_TOKEN."
)


def require_admin(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Security(_admin_bearer)
) -> None:
    expected: bytes = request.app.state.admin_token
    given = credentials.credentials.encode() if credentials else b""
    if not hmac.compare_digest(given, expected):
        authentication_failed("admin_token")
        raise ApiError(
            401,
            "The admin API needs 'Authorization: Bearer <admin token>' with the configured "
            "admin token (SERVICEAI_ADMIN_TOKEN); API keys are not accepted here.",
            code="invalid_admin_token",
            headers={"WWW-Authenticate": "Bearer"},
        )


router = APIRouter(
    prefix="/admin",
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses={status: {"model": ErrorResponse} for status in (400, 401, 404, 409, 503)},
)


# Every change made here is audited under this name: the admin token is one shared secret.
ADMIN = Actor.admin_api()


def _store(request: Request) -> KeyStore:
    return request.app.state.store


def _keys(request: Request) -> KeyVerifier:
    return request.app.state.keys


def _offered(request: Request, plan: str | None) -> None:
    """A 400 naming the configured plans when `plan` is not one of them."""
    plans = request.app.state.limits.plans
    if plan is not None and plans.get(plan) is None:
        raise ApiError(
            400,
            f"There is no plan '{plan}'. Plans: {', '.join(plans.names)} (serve_config.yaml).",
            param="plan",
            code="unknown_plan",
        )


@router.post("/users", status_code=201, response_model=User)
async def create_user(body: UserCreate, request: Request) -> User:
    _offered(request, body.plan)
    return await _store(request).create_user(body.email, body.plan, actor=ADMIN)


@router.get("/users", response_model=Page[User])
async def list_users(
    request: Request,
    limit: int = Query(100, ge=1, le=MAX_PAGE),
    after: str | None = Query(None, description="The id of the last user of the previous page."),
    order: Order = Query("asc", description="asc: oldest first; desc: newest first."),
) -> Page[User]:
    return await _store(request).list_users(limit=limit, after=after, order=order)


@router.get("/users/{user}", response_model=User)
async def get_user(user: str, request: Request) -> User:
    """A user by id or email."""
    return await _store(request).get_user(user)


@router.patch("/users/{user}", response_model=User)
async def update_user(user: str, body: UserUpdate, request: Request) -> User:
    """Change the plan or the role ("admin": an operator of the console), or disable (and
    enable) the user: a disabled user's keys stop working."""
    _offered(request, body.plan)
    budget = (
        {"monthly_tokens": body.monthly_tokens} if "monthly_tokens" in body.model_fields_set else {}
    )
    updated = await _store(request).update_user(
        user, plan=body.plan, disabled=body.disabled, role=body.role, actor=ADMIN, **budget
    )
    _keys(request).forget(user_id=updated.id)
    return updated


@router.post("/users/{user}/keys", status_code=201, response_model=IssuedApiKey)
async def create_key(user: str, request: Request, body: ApiKeyCreate | None = None) -> IssuedApiKey:
    """A new key for the user, with the scopes given. The secret `key` is in this response
    only."""
    body = body or ApiKeyCreate()
    check_models(body, request.app.state.models.names)
    return await _store(request).create_key(user, body.name, body, actor=ADMIN)


@router.patch("/keys/{key_id}", response_model=ApiKey)
async def update_key(key_id: str, body: ApiKeyUpdate, request: Request) -> ApiKey:
    """Change a key's scopes: a field sent replaces it (null clears), one left out stays. Other
    replicas see the change within the key cache's TTL."""
    check_models(body, request.app.state.models.names)
    updated = await _store(request).update_key(
        key_id, body.model_dump(include=body.model_fields_set), actor=ADMIN
    )
    _keys(request).forget(key_id=key_id)
    return updated


@router.post("/keys/{key_id}/rotate", status_code=201, response_model=IssuedApiKey)
async def rotate_key(
    key_id: str, request: Request, body: ApiKeyRotate | None = None
) -> IssuedApiKey:
    """A new key with the same name and scopes; the old one works for `grace_seconds` more,
    then is revoked. The new secret is in this response only."""
    grace = timedelta(seconds=(body or ApiKeyRotate()).grace_seconds)
    issued = await _store(request).rotate_key(key_id, grace, actor=ADMIN)
    _keys(request).forget(key_id=key_id)
    return issued


@router.get("/keys", response_model=Page[ApiKey])
async def list_keys(
    request: Request,
    user: str | None = Query(None, description="Only this user's keys (id or email)."),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
    after: str | None = Query(None, description="The id of the last key of the previous page."),
    order: Order = Query("asc", description="asc: oldest first; desc: newest first."),
) -> Page[ApiKey]:
    return await _store(request).list_keys(user, limit=limit, after=after, order=order)


@router.delete("/keys/{key_id}", response_model=ApiKey)
async def revoke_key(key_id: str, request: Request) -> ApiKey:
    """Revoke a key: refused at once by this replica, by every other within the key cache TTL."""
    return await _keys(request).revoke(key_id, actor=ADMIN)


@router.get("/usage", response_model=UsageList)
async def get_usage(
    request: Request,
    user: str | None = Query(None, description="Only this user's keys (id or email)."),
    key_id: str | None = Query(None, description="Only this key."),
    start_date: date | None = Query(None, description="First UTC day (default: 29 days back)."),
    end_date: date | None = Query(None, description="Last UTC day (default: today)."),
) -> UsageList:
    """Usage per key, model type and UTC day: requests, prompt and completion tokens."""
    return await _store(request).usage(user=user, key_id=key_id, start=start_date, end=end_date)


@router.get("/audit", response_model=AuditPage)
async def get_audit_log(
    request: Request,
    limit: int = Query(50, ge=1, le=MAX_PAGE),
    before: int | None = Query(
        None, ge=1, le=LAST_ID, description="The id of the last entry of the previous page."
    ),
) -> AuditPage:
    """Operator actions (console, CLI, admin API), newest first."""
    return await _store(request).audit_log(limit=limit, before=before)


@router.post("/adapters", status_code=201, response_model=Adapter)
async def register_adapter(body: AdapterCreate, request: Request) -> Adapter:
    """Register a LoRA adapter on a model type whose engine takes adapters: clients call it as
    `model:name` at once on this ingress replica, on every other within the key cache TTL; each
    model replica loads it from `path` the first time a request names it."""
    registered = request.app.state.adapters
    check_adapter_path(body.path, registered.roots, registered.hub_ids)
    await check_registrable(request.app.state.models, body.model, body.name)
    adapter = await _store(request).register_adapter(body.model, body.name, body.path, actor=ADMIN)
    request.app.state.adapters.forget()
    return adapter


@router.get("/adapters", response_model=AdapterList)
async def list_adapters(
    request: Request, model: str | None = Query(None, description="Only this model type's.")
) -> AdapterList:
    """The registered LoRA adapters (those in the config are listed by /v1/models)."""
    return AdapterList(data=await _store(request).adapters(model))


@router.delete("/adapters/{adapter_id}", response_model=Adapter)
async def remove_adapter(adapter_id: str, request: Request) -> Adapter:
    """Unregister an adapter (`model:name`): a 404 for its callers at once on this ingress
    replica, on every other within the key cache TTL."""
    model_type, _, name = adapter_id.partition(":")
    adapter = await _store(request).remove_adapter(model_type, name, actor=ADMIN)
    request.app.state.adapters.forget()
    return adapter
