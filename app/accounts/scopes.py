"""Key scopes as the APIs take them: model types that exist, and a key holder who may narrow
a key's scopes but never widen them (an operator may do both).

Through the account API a key manages its user's keys only when it has `manage_keys`, and it
mints keys (creates, rotates) only when it has no limits of its own: a key it made would have
counters of its own, so a spent key's child would start afresh. The console, signed in as the
user, and an operator keep full power.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TypeVar

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
    if wanted.manage_keys and not ceiling.manage_keys:
        return "manage_keys"
    return None


def narrowest(key: KeyScopes, ceiling: KeyScopes) -> KeyScopes:
    """`key`'s scopes where `ceiling` covers them, `ceiling`'s where it does not: what a key
    rotated by a narrower key may keep. A 403 when they share no model type."""
    models = key.models
    if ceiling.models is not None:
        models = ceiling.models if key.models is None else _shared(key.models, ceiling.models)
        if not models:
            raise ApiError(
                403,
                "The key in use may call none of the model types of the key to rotate, so the "
                "new key could call nothing. Rotate it with a key that covers its models, or in "
                "the console.",
                param="models",
                code="scope_not_narrower",
            )
    mine, most = key.limits or KeyLimits(), ceiling.limits or KeyLimits()
    limits = KeyLimits(
        **{
            name: _least(getattr(mine, name), getattr(most, name))
            for name in KeyLimits.model_fields
        }
    )
    return KeyScopes(
        models=models,
        expires_at=_least(key.expires_at, ceiling.expires_at),
        limits=None if limits.is_empty() else limits,
        monthly_tokens=_least(key.monthly_tokens, ceiling.monthly_tokens),
        manage_keys=key.manage_keys and ceiling.manage_keys,
    )


def _shared(models: list[str], others: list[str]) -> list[str]:
    """The names both lists allow (a type's adapter where one names the type, the other it)."""
    shared = [m for m in models if covers(others, m)]
    return shared + [m for m in others if covers(models, m) and m not in shared]


Bound = TypeVar("Bound", int, datetime)


def _least(one: Bound | None, other: Bound | None) -> Bound | None:
    if one is None or other is None:
        return other if one is None else one
    return min(one, other)


def check_may_manage(caller: KeyScopes, what: str) -> None:
    """A 403 for a key without `manage_keys` asking to `what` (e.g. "rotate keys")."""
    if not caller.manage_keys:
        raise ApiError(
            403,
            f"This API key may not {what}: it was made without key management "
            "(manage_keys false). Use a key that may manage keys, or the console.",
            type="invalid_request_error",
            code="key_management_not_allowed",
        )


def check_may_mint(caller: KeyScopes, what: str) -> None:
    """A 403 for a key that may not make a key (`what`: "create keys", "rotate keys"): one
    without `manage_keys`, or one with limits of its own, which its child would not share."""
    check_may_manage(caller, what)
    if caller.has_limits():
        raise ApiError(
            403,
            f"This API key may not {what}: it has limits of its own (limits or "
            "monthly_tokens), and a key it made would not share their counters. Make keys "
            "with a key that has no limits of its own, or in the console.",
            type="invalid_request_error",
            code="key_has_limits",
        )


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
