"""Creating a key from the console's form: the same for a user's own keys and an operator's."""

from __future__ import annotations

from fastapi import Request
from pydantic import ValidationError

from app.accounts.keystore import KeyStore
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.errors import KeyLimitReached, UserDisabled
from app.accounts.keystore.schemas import IssuedApiKey
from app.accounts.scopes import check_models
from app.console import session
from app.console.forms import KeyForm, problem
from app.openai.errors import ApiError


class KeyRefused(Exception):
    """The form's key was not created: the page is shown again with the error and the form."""

    def __init__(self, status: int, error: str, form: dict) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.form = form


async def create_key_from_form(
    request: Request,
    store: KeyStore,
    owner_id: str,
    model_types: list[str],
    actor: Actor | None = None,
) -> IssuedApiKey:
    """The key the posted form describes, for `owner_id`; `KeyRefused` with the status and the
    message of what is wrong (400 a field or a model type not offered, 409 a limit or a
    disabled owner)."""
    form = await session.checked_form(request)
    fields = {**dict(form), "models": form.getlist("models")}
    try:
        key = KeyForm.model_validate(fields)
        scopes = key.scopes()
        check_models(scopes, model_types)
        return await store.create_key(owner_id, key.name, scopes, actor=actor)
    except ValidationError as exc:
        raise KeyRefused(400, problem(exc), fields) from None
    except ApiError as exc:  # a model type that is not offered
        raise KeyRefused(400, exc.message, fields) from None
    except (KeyLimitReached, UserDisabled) as exc:
        raise KeyRefused(409, exc.message, fields) from None
