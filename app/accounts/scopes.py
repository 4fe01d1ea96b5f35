"""Key scopes as the APIs take them: model types that exist, and a key holder who may narrow
a key's scopes but never widen them (an operator may do both)."""

from __future__ import annotations

from collections.abc import Iterable

from app.accounts.keystore.schemas import KeyLimits, KeyScopes
from app.openai.errors import ApiError


def covers(models: Iterable[str], name: str) -> bool:
    """A scope's models allow `name`: a type, or one of its LoRA adapters (`Type:adapter`),
    which a type's scope allows too; a key scoped to an adapter calls that adapter alone."""
    allowed = set(models)
    return name in allowed or (":" in name and name.partition(":")[0] in allowed)


def check_models(scopes: KeyScopes, model_types: Iterable[str]) -> None:
    """A 400 naming the model types when `scopes.models` names another (an adapter of a
    known type, `Type:adapter`, is allowed)."""
    known = list(model_types)
    for name in scopes.models or ():
        if name.partition(":")[0] not in known:
            raise ApiError(
                400,
                f"There is no model type '{name[:64]}'. Model types: {', '.join(known)}.",
                param="models",
                code="model_not_found",
            )


def widened(ceiling: KeyScopes, wanted: KeyScopes) -> str | None:
    """The first field in which `wanted` allows more than `ceiling`, or None."""
    if ceiling.models is not None and (
        wanted.models is None or not all(covers(ceiling.models, m) for m in wanted.models)
    ):
        return "models"
    if ceiling.expires_at is not None and (
        wanted.expires_at is None or wanted.expires_at > ceiling.expires_at
    ):
        return "expires_at"
    most, asked = ceiling.limits or KeyLimits(), wanted.limits or KeyLimits()
    for name in KeyLimits.model_fields:
        limit = getattr(most, name)
        if limit is not None and (getattr(asked, name) is None or getattr(asked, name) > limit):
            return f"limits.{name}"
    if ceiling.monthly_tokens is not None and (
        wanted.monthly_tokens is None or wanted.monthly_tokens > ceiling.monthly_tokens
    ):
        return "monthly_tokens"
    return None


def check_narrower(ceiling: KeyScopes, wanted: KeyScopes, what: str) -> None:
    """A 403 naming the field where `wanted` would widen `ceiling` (`what` says whose it is)."""
    field = widened(ceiling, wanted)
    if field is not None:
        raise ApiError(
            403,
            f"A key's scopes can be narrowed here, never widened: '{field}' would allow more "
            f"than {what}. An operator can widen a key (serviceai keys update).",
            type="invalid_request_error",
            param=field,
            code="scope_not_narrower",
        )
