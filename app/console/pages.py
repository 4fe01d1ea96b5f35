"""The console's pages: sign up, sign in, API keys (create, copy once, rotate, revoke), plan.

Every change goes through the same `KeyStore` and `KeyVerifier` calls as the CLI, the admin API
and /v1/account; these handlers only read forms and render templates.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import KeyStore
from app.accounts.keystore.errors import UserExists, WrongCredentials
from app.accounts.keystore.schemas import MAX_PAGE, IssuedApiKey, UsageTotals, User
from app.console import session
from app.console.charts import BarChart
from app.console.forms import SignInForm, SignUpForm, grace_hours, problem
from app.console.new_keys import KeyRefused, create_key_from_form
from app.console.session import signed_in_user
from app.console.sign_in_limit import SignInLimit
from app.console.usage_view import last_days, model_chart
from app.limits.admission import RateLimits
from app.limits.plans import ModelTypeLimits
from app.openai.errors import ApiError
from deployments.catalog import LOGICAL_MODEL_TYPES, LogicalModelType

templates = Jinja2Templates(directory=Path(__file__).resolve().parent / "templates")
router = APIRouter()


def when(unix_time: int | None, missing: str = "—") -> str:
    if unix_time is None:
        return missing
    return datetime.fromtimestamp(unix_time, UTC).strftime("%Y-%m-%d %H:%M UTC")


templates.env.filters["when"] = when


def render(
    request: Request,
    template: str,
    status: int = 200,
    headers: dict[str, str] | None = None,
    **context: object,
) -> HTMLResponse:
    context["base"] = request.scope.get("root_path", "")
    context["base_url"] = request.app.state.base_url
    context["model_types"] = _model_types(request)
    # The 500 page is rendered outside the session middleware, without a form to protect.
    context["csrf"] = session.csrf_token(request) if "session" in request.scope else None
    context["sign_up"] = request.app.state.sign_up
    return templates.TemplateResponse(request, template, context, status, headers)


def _model_types(request: Request) -> list[LogicalModelType]:
    return [
        LOGICAL_MODEL_TYPES.get(name, LogicalModelType(name, "", ""))
        for name in request.app.state.models.names
    ]


def go(request: Request, page: str) -> RedirectResponse:
    """After a POST: 303, so that reloading the next page does not send the form again."""
    return RedirectResponse(f"{request.scope.get('root_path', '')}/{page}", status_code=303)


def _store(request: Request) -> KeyStore:
    return request.app.state.store


def _address(request: Request) -> str:
    return request.app.state.client_address.of(request)


@router.get("/")
async def home(request: Request) -> Response:
    return go(request, "keys" if "user" in request.session else "sign-in")


@router.get("/sign-up")
async def sign_up_page(request: Request) -> Response:
    return render(request, "sign_up.html")


@router.post("/sign-up")
async def sign_up(request: Request) -> Response:
    form = await session.checked_form(request)
    mode = request.app.state.sign_up
    if mode == "off":
        return render(request, "sign_up.html", 403)
    limit: SignInLimit = request.app.state.sign_in_limit
    wait_s = limit.attempt(email=None, address=_address(request))
    if wait_s is not None:
        return _too_many(request, "sign_up.html", wait_s, email=form.get("email"))
    try:
        fields = SignUpForm.model_validate(dict(form))
        user = await _store(request).create_user(
            fields.email,
            password=fields.password.get_secret_value(),
            disabled=mode == "approval",
        )
    except ValidationError as exc:
        return render(request, "sign_up.html", 400, error=problem(exc), email=form.get("email"))
    except UserExists:
        if mode == "approval":  # the same answer as for a new email: nothing to learn here
            return render(request, "sign_up.html", 202, requested=True)
        return render(
            request,
            "sign_up.html",
            409,
            email=form.get("email"),
            error="An account with this email already exists: sign in instead.",
        )
    if mode == "approval":
        return render(request, "sign_up.html", 202, requested=True)
    await session.start(request, user)
    return go(request, "keys")


@router.get("/sign-in")
async def sign_in_page(request: Request) -> Response:
    if "user" in request.session:
        return go(request, "keys")
    return render(request, "sign_in.html")


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    form = await session.checked_form(request)
    try:
        fields = SignInForm.model_validate(dict(form))
    except ValidationError as exc:
        return render(request, "sign_in.html", 400, error=problem(exc), email=form.get("email"))
    limit: SignInLimit = request.app.state.sign_in_limit
    wait_s = limit.attempt(email=fields.email, address=_address(request))
    if wait_s is not None:
        return _too_many(request, "sign_in.html", wait_s, email=fields.email)
    try:
        user = await _store(request).check_password(
            fields.email, fields.password.get_secret_value()
        )
    except WrongCredentials as exc:
        return render(request, "sign_in.html", 401, error=exc.message, email=fields.email)
    if user.disabled:
        return render(
            request,
            "sign_in.html",
            403,
            email=fields.email,
            error="This account is disabled. Ask the operator of this service to enable it.",
        )
    await session.start(request, user)
    return go(request, "keys")


def _too_many(request: Request, template: str, wait_s: int, **context: object) -> Response:
    return render(
        request,
        template,
        429,
        {"Retry-After": str(wait_s)},
        error=f"Too many attempts. Try again in {wait_s} s.",
        **context,
    )


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    await session.checked_form(request)
    await session.end_everywhere(request)
    return go(request, "sign-in")


@router.get("/keys")
async def keys_page(request: Request, user: User = Depends(signed_in_user)) -> Response:
    return await _keys(request, user)


@router.post("/keys")
async def create_key(request: Request, user: User = Depends(signed_in_user)) -> Response:
    try:
        issued = await create_key_from_form(
            request, _store(request), user.id, request.app.state.models.names
        )
    except KeyRefused as refused:
        return await _keys(request, user, refused.status, error=refused.error, form=refused.form)
    return await _keys(request, user, 201, new_key=issued)


async def _keys(
    request: Request,
    user: User,
    status: int = 200,
    *,
    new_key: IssuedApiKey | None = None,
    **context: object,
) -> Response:
    page = await _store(request).list_keys(user.id, limit=MAX_PAGE, order="desc")
    context.setdefault("form", {})
    return render(
        request,
        "keys.html",
        status,
        None,
        user=user,
        keys=page.data,
        more=page.has_more,
        new_key=new_key,
        notice=request.session.pop("notice", None),
        scope_types=request.app.state.models.names,
        **context,
    )


@router.get("/keys/{key_id}/revoke")
async def revoke_page(
    key_id: str, request: Request, user: User = Depends(signed_in_user)
) -> Response:
    key = next(
        (
            k
            for k in (await _store(request).list_keys(user.id, limit=MAX_PAGE)).data
            if k.id == key_id
        ),
        None,
    )
    if key is None or key.revoked:
        return go(request, "keys")
    return render(request, "revoke.html", user=user, key=key)


@router.post("/keys/{key_id}/revoke")
async def revoke(key_id: str, request: Request, user: User = Depends(signed_in_user)) -> Response:
    await session.checked_form(request)
    keys: KeyVerifier = request.app.state.keys
    revoked = await keys.revoke(key_id, owner_id=user.id)
    name = f'"{revoked.name}" ' if revoked.name else ""
    request.session["notice"] = f"Key {name}({revoked.display}) is revoked: it no longer works."
    return go(request, "keys")


@router.post("/keys/{key_id}/rotate")
async def rotate(key_id: str, request: Request, user: User = Depends(signed_in_user)) -> Response:
    """A new key with the old one's name and scopes, shown once; the old one works for the
    hours chosen, as with POST /v1/account/keys/{id}/rotate."""
    hours = grace_hours(await session.checked_form(request))
    old = await _store(request).get_key(key_id, owner_id=user.id)
    issued = await _store(request).rotate_key(key_id, timedelta(hours=hours), owner_id=user.id)
    request.app.state.keys.forget(key_id=key_id)
    return await _keys(request, user, 201, new_key=issued, rotated=old.display, grace_hours=hours)


class ModelTypeUsage(NamedTuple):
    """One row of the plan page: a model type, its limits on the user's plan, today's use."""

    name: str
    description: str
    limits: ModelTypeLimits | None
    today: UsageTotals
    last_30_days: BarChart


@router.get("/plan")
async def plan_page(request: Request, user: User = Depends(signed_in_user)) -> Response:
    """The plan's limits per model type, today's use as the rate limiter and store see it, and
    a chart per type of the last 30 days."""
    limits: RateLimits = request.app.state.limits
    try:
        plan = limits.plan_limits(user.plan)
        problem = None
    except ApiError as exc:
        plan, problem = None, exc.message
    used = await _store(request).usage_today(user.id)
    budget = await _store(request).budget(user=user.id)
    start, end = last_days(30)
    days = await _store(request).daily_totals(start, end, user_id=user.id)
    names = request.app.state.models.names
    rows = [
        ModelTypeUsage(
            model.name,
            model.description,
            plan.on(model.name) if plan else None,
            used.get(model.name, UsageTotals()),
            model_chart(days, start, end, model.name, names),
        )
        for model in _model_types(request)
    ]
    return render(request, "plan.html", user=user, rows=rows, budget=budget, error=problem)
