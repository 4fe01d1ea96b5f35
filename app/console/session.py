"""Who is signed in to the console, and proof that a form came from the console itself.

The session is Starlette's signed cookie (itsdangerous, HttpOnly, SameSite=Lax). It holds the
user's id, the user's session version and a random CSRF token; every form carries that token back
in a hidden field, and a POST whose token does not match is refused before it does anything.
The version is kept in the key store: signing out or a new password bumps it, and every copy of
every cookie issued before is refused from then on, on every replica.
"""

from __future__ import annotations

import hmac
import secrets

from fastapi import Depends, HTTPException, Request
from starlette.datastructures import FormData

from app.accounts.keystore import KeyStore
from app.accounts.keystore.errors import UserNotFound
from app.accounts.keystore.schemas import User

CSRF_FIELD = "csrf_token"


class SignInRequired(Exception):
    """No (valid) session: the page sends the browser to the sign-in form."""


class CsrfRejected(Exception):
    """A form without this session's CSRF token: made elsewhere, or from an ended session."""


def csrf_token(request: Request) -> str:
    """This session's CSRF token, made on first use (an anonymous session has one too)."""
    token = request.session.get("csrf")
    if token is None:
        token = request.session["csrf"] = secrets.token_urlsafe(32)
    return token


async def checked_form(request: Request) -> FormData:
    """The POSTed form, once its CSRF token matches this session's."""
    form = await request.form()
    given = form.get(CSRF_FIELD)
    expected = request.session.get("csrf")
    if not isinstance(given, str) or expected is None:
        raise CsrfRejected()
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise CsrfRejected()
    return form


async def start(request: Request, user: User) -> None:
    """Sign `user` in: a fresh session, so nothing from before the sign-in carries over."""
    store: KeyStore = request.app.state.store
    request.session.clear()
    request.session["user"] = user.id
    request.session["version"] = await store.session_version(user.id)
    csrf_token(request)


def end(request: Request) -> None:
    request.session.clear()


async def end_everywhere(request: Request) -> None:
    """Sign out: this cookie, and every copy of it or of the user's other sessions."""
    user_id = request.session.get("user")
    if user_id is not None:
        await request.app.state.store.end_sessions(user_id)
    end(request)


async def signed_in_user(request: Request) -> User:
    """The session's user; an ended, unknown or disabled one is signed out."""
    user_id = request.session.get("user")
    if user_id is None:
        raise SignInRequired()
    store: KeyStore = request.app.state.store
    if request.session.get("version") != await store.session_version(user_id):
        end(request)  # signed out elsewhere, a new password, or no such user
        raise SignInRequired()
    try:
        user = await store.get_user(user_id)
    except UserNotFound:
        user = None
    if user is None or user.disabled:
        end(request)
        raise SignInRequired()
    return user


async def signed_in_operator(request: Request, user: User = Depends(signed_in_user)) -> User:
    """The session's user when an operator (role "admin"); anyone else gets the 403 page. Read
    from the store on every request, so taking the role back takes effect at once."""
    if user.role != "admin":
        raise HTTPException(403, "This page is for the operators of this service only.")
    return user
