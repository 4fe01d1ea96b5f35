"""The operator's pages under /console/admin: users, their keys, plans, usage over time and the
audit log.

Every route here depends on `signed_in_operator` (through the router), so each request is
checked on the server and refused with the console's 403 page to anyone but an operator; every
form carries the session's CSRF token as on the user's pages. Changes go through the same
`KeyStore` and `KeyVerifier` calls as the CLI and the admin API, each with the operator as the
audit log's actor.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from pydantic import ValidationError

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.accounts.keystore.audit import LAST_ID, Actor
from app.accounts.keystore.schemas import MAX_PAGE, IssuedApiKey, User
from app.console import session
from app.console.forms import (
    NewUserForm,
    RoleForm,
    grace_hours,
    problem,
    whole_number,
)
from app.console.new_keys import KeyRefused, create_key_from_form
from app.console.pages import go, render
from app.console.session import signed_in_operator
from app.console.usage_view import RANGES, last_days, usage_over_time

PAGE = 50
TOP = 10

router = APIRouter(prefix="/admin", dependencies=[Depends(signed_in_operator)])


def _store(request: Request) -> KeyStore:
    return request.app.state.store


def _keys(request: Request) -> KeyVerifier:
    return request.app.state.keys


def _plans(request: Request) -> list[str]:
    return request.app.state.limits.plans.names


def _model_types(request: Request) -> list[str]:
    return request.app.state.models.names


def _page(
    request: Request, template: str, operator: User, status: int = 200, **context: object
) -> Response:
    return render(
        request,
        template,
        status,
        None,
        user=operator,
        notice=request.session.pop("notice", None),
        **context,
    )


@router.get("/")
async def home(request: Request) -> Response:
    return go(request, "admin/users")


# Users


@router.get("/users")
async def users_page(
    request: Request,
    q: str | None = None,
    after: str | None = None,
    operator: User = Depends(signed_in_operator),
) -> Response:
    return await _users(request, operator, q=q, after=after)


async def _users(
    request: Request,
    operator: User,
    status: int = 200,
    *,
    q: str | None = None,
    after: str | None = None,
    **context: object,
) -> Response:
    found = await _store(request).list_users(PAGE, after or None, email_contains=q, order="desc")
    context.setdefault("form", {})
    return _page(
        request,
        "admin_users.html",
        operator,
        status,
        users=found.data,
        more=found.has_more,
        q=q or "",
        plans=_plans(request),
        **context,
    )


@router.post("/users")
async def create_user(request: Request, operator: User = Depends(signed_in_operator)) -> Response:
    form = await session.checked_form(request)
    fields = dict(form)
    try:
        new = NewUserForm.model_validate(fields)
        if new.plan not in _plans(request):
            raise HTTPException(400, f"There is no plan '{new.plan}'.")
        user = await _store(request).create_user(
            new.email,
            new.plan,
            actor=Actor.operator(operator.email),
            password=None if new.password is None else new.password.get_secret_value(),
        )
    except ValidationError as exc:
        return await _users(request, operator, 400, error=problem(exc), form=fields)
    request.session["notice"] = f"User {user.email} is created on the {user.plan} plan."
    return go(request, f"admin/users/{user.id}")


@router.get("/users/{user_id}")
async def user_page(
    user_id: str, request: Request, operator: User = Depends(signed_in_operator)
) -> Response:
    return await _user(request, operator, user_id)


async def _user(
    request: Request,
    operator: User,
    user_id: str,
    status: int = 200,
    *,
    new_key: IssuedApiKey | None = None,
    **context: object,
) -> Response:
    store = _store(request)
    shown = await store.get_user(user_id)
    keys = await store.list_keys(shown.id, limit=MAX_PAGE)
    start, end = last_days(30)
    rows = await store.daily_totals(start, end, user_id=shown.id)
    context.setdefault("form", {})
    return _page(
        request,
        "admin_user.html",
        operator,
        status,
        shown=shown,
        keys=keys.data,
        more=keys.has_more,
        plans=_plans(request),
        scope_types=_model_types(request),
        usage=usage_over_time(rows, start, end, _model_types(request)),
        top_keys=await store.top_keys(start, end, TOP, user_id=shown.id),
        budget=await store.budget(user=shown.id),
        new_key=new_key,
        **context,
    )


async def _change_user(request: Request, operator: User, user_id: str, **change: Any) -> User:
    changed = await _store(request).update_user(
        user_id, actor=Actor.operator(operator.email), **change
    )
    _keys(request).forget(user_id=changed.id)
    return changed


@router.post("/users/{user_id}/plan")
async def set_plan(
    user_id: str, request: Request, operator: User = Depends(signed_in_operator)
) -> Response:
    plan = (await session.checked_form(request)).get("plan")
    if plan not in _plans(request):
        raise HTTPException(400, f"There is no plan '{str(plan)[:32]}'.")
    changed = await _change_user(request, operator, user_id, plan=plan)
    request.session["notice"] = f"{changed.email} is now on the {changed.plan} plan."
    return go(request, f"admin/users/{changed.id}")


@router.post("/users/{user_id}/role")
async def set_role(
    user_id: str, request: Request, operator: User = Depends(signed_in_operator)
) -> Response:
    try:
        role = RoleForm.model_validate(dict(await session.checked_form(request))).role
    except ValidationError as exc:
        raise HTTPException(400, problem(exc)) from None
    changed = await _change_user(request, operator, user_id, role=role)
    request.session["notice"] = (
        f"{changed.email} is {'an operator' if role == 'admin' else 'a user'} now."
    )
    return go(request, f"admin/users/{changed.id}")


@router.post("/users/{user_id}/disable")
async def disable(
    user_id: str, request: Request, operator: User = Depends(signed_in_operator)
) -> Response:
    await session.checked_form(request)
    changed = await _change_user(request, operator, user_id, disabled=True)
    request.session["notice"] = f"{changed.email} is disabled: their keys stop working."
    return go(request, f"admin/users/{changed.id}")


@router.post("/users/{user_id}/enable")
async def enable(
    user_id: str, request: Request, operator: User = Depends(signed_in_operator)
) -> Response:
    await session.checked_form(request)
    changed = await _change_user(request, operator, user_id, disabled=False)
    request.session["notice"] = f"{changed.email} is enabled again."
    return go(request, f"admin/users/{changed.id}")


# Keys


@router.post("/users/{user_id}/keys")
async def create_key(
    user_id: str, request: Request, operator: User = Depends(signed_in_operator)
) -> Response:
    actor = Actor.operator(operator.email)
    try:
        issued = await create_key_from_form(
            request, _store(request), user_id, _model_types(request), actor
        )
    except KeyRefused as refused:
        return await _user(
            request, operator, user_id, refused.status, error=refused.error, form=refused.form
        )
    return await _user(request, operator, issued.user_id, 201, new_key=issued)


@router.get("/keys")
async def keys_page(
    request: Request,
    user: str | None = None,
    after: str | None = None,
    operator: User = Depends(signed_in_operator),
) -> Response:
    found = await _store(request).list_keys(
        user or None, limit=PAGE, after=after or None, order="desc"
    )
    owners = await _store(request).emails({key.user_id for key in found.data})
    return _page(
        request,
        "admin_keys.html",
        operator,
        keys=found.data,
        more=found.has_more,
        owners=owners,
        user_filter=user or "",
    )


@router.get("/keys/{key_id}/revoke")
async def revoke_page(
    key_id: str, request: Request, operator: User = Depends(signed_in_operator)
) -> Response:
    """Asks once more: a revocation cannot be undone, and the key is someone else's."""
    key = await _store(request).get_key(key_id)
    if key.revoked:
        return go(request, f"admin/users/{key.user_id}")
    owner = await _store(request).get_user(key.user_id)
    return _page(request, "revoke.html", operator, key=key, owner=owner.email)


@router.post("/keys/{key_id}/revoke")
async def revoke(
    key_id: str, request: Request, operator: User = Depends(signed_in_operator)
) -> Response:
    await session.checked_form(request)
    revoked = await _keys(request).revoke(key_id, actor=Actor.operator(operator.email))
    name = f'"{revoked.name}" ' if revoked.name else ""
    request.session["notice"] = f"Key {name}({revoked.display}) is revoked: it no longer works."
    return go(request, f"admin/users/{revoked.user_id}")


@router.post("/keys/{key_id}/rotate")
async def rotate(
    key_id: str, request: Request, operator: User = Depends(signed_in_operator)
) -> Response:
    form = await session.checked_form(request)
    hours = grace_hours(form)
    issued = await _store(request).rotate_key(
        key_id, timedelta(hours=hours), actor=Actor.operator(operator.email)
    )
    _keys(request).forget(key_id=key_id)
    return await _user(
        request, operator, issued.user_id, 201, new_key=issued, rotated=key_id, grace_hours=hours
    )


# Plans, usage, audit


@router.get("/plans")
async def plans_page(request: Request, operator: User = Depends(signed_in_operator)) -> Response:
    plans = request.app.state.limits.plans
    counts = await _store(request).users_per_plan()
    unknown = {name: n for name, n in counts.items() if plans.get(name) is None}
    return _page(
        request,
        "admin_plans.html",
        operator,
        plans=plans.root,
        counts=counts,
        unknown=unknown,
        type_names=_model_types(request),
    )


async def _usage(request: Request, days: str | None):
    chosen = whole_number(days, "days", max(RANGES)) or 30
    if chosen not in RANGES:
        raise HTTPException(400, f"'days' must be one of {', '.join(map(str, RANGES))}.")
    start, end = last_days(chosen)
    rows = await _store(request).daily_totals(start, end)
    return chosen, start, end, usage_over_time(rows, start, end, _model_types(request))


@router.get("/usage")
async def usage_page(
    request: Request, days: str | None = None, operator: User = Depends(signed_in_operator)
) -> Response:
    chosen, start, end, usage = await _usage(request, days)
    top_users, top_keys = await _store(request).top(start, end, TOP)
    return _page(
        request,
        "admin_usage.html",
        operator,
        usage=usage,
        days=chosen,
        ranges=RANGES,
        top_users=top_users,
        top_keys=top_keys,
    )


@router.get("/usage.csv")
async def usage_csv(request: Request, days: str | None = None) -> Response:
    chosen, start, end, usage = await _usage(request, days)
    return Response(
        usage.csv(),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="usage-{start.isoformat()}-{end.isoformat()}.csv"'
        },
    )


@router.get("/audit")
async def audit_page(
    request: Request, before: str | None = None, operator: User = Depends(signed_in_operator)
) -> Response:
    before_id = whole_number(before, "before", LAST_ID)
    log = await _store(request).audit_log(limit=PAGE, before=before_id)
    return _page(request, "admin_audit.html", operator, entries=log.data, more=log.has_more)
