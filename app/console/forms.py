"""The console's forms as pydantic models, their errors as one sentence naming the field, and
the whole-number parameters (a rotated key's grace, a range of days) read as a 400 page."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, time
from typing import Annotated

from fastapi import HTTPException
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from app.accounts.keystore import passwords
from app.accounts.keystore.schemas import (
    DEFAULT_GRACE_S,
    MAX_GRACE_S,
    Count,
    Email,
    KeyName,
    KeyScopes,
    ModelTypeName,
    Password,
    PlanName,
    Role,
    TokenCount,
)

_LABELS = {
    "email": "Email",
    "password": "Password",
    "password_again": "Repeat password",
    "name": "Key name",
    "expires_on": "Expires on",
    "requests_per_minute": "Requests per minute",
    "tokens_per_minute": "Tokens per minute",
    "concurrent_requests": "Requests at once",
    "tokens_per_day": "Tokens per day",
    "monthly_tokens": "Tokens per month",
    "no_key_management": "Cannot manage keys",
    "models": "Model types",
    "plan": "Plan",
    "role": "Role",
}


class SignUpForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    email: Email
    password: Password
    password_again: SecretStr

    @model_validator(mode="after")
    def _same_twice(self) -> SignUpForm:
        if self.password.get_secret_value() != self.password_again.get_secret_value():
            raise ValueError("the two passwords differ")
        return self


class SignInForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    email: Annotated[str, Field(min_length=1, max_length=320)]
    password: Annotated[SecretStr, Field(min_length=1, max_length=passwords.MAX_LENGTH)]


class KeyForm(BaseModel):
    """A new key: its name, and the scopes the API takes (an empty field: none)."""

    model_config = ConfigDict(extra="ignore")

    name: KeyName
    models: list[ModelTypeName] | None = None
    expires_on: date | None = None
    requests_per_minute: Count | None = None
    tokens_per_minute: TokenCount | None = None
    concurrent_requests: Count | None = None
    tokens_per_day: TokenCount | None = None
    monthly_tokens: TokenCount | None = None
    no_key_management: bool = False
    """A ticked box: the key may not create, change, rotate or revoke keys through the API."""

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" or value == [] else value

    @field_validator("expires_on")
    @classmethod
    def _in_the_future(cls, value: date | None) -> date | None:
        if value is not None and value <= datetime.now(UTC).date():
            raise ValueError("must be a day after today")
        return value

    def scopes(self) -> KeyScopes:
        limits = {
            name: getattr(self, name)
            for name in (
                "requests_per_minute",
                "tokens_per_minute",
                "concurrent_requests",
                "tokens_per_day",
            )
            if getattr(self, name) is not None
        }
        return KeyScopes(
            models=self.models,
            expires_at=None
            if self.expires_on is None
            else datetime.combine(self.expires_on, time(), UTC),
            limits=limits or None,
            monthly_tokens=self.monthly_tokens,
            manage_keys=not self.no_key_management,
        )


def problem(exc: ValidationError) -> str:
    """'Password: should have at least 10 characters.' for the first error of a form."""
    error = exc.errors()[0]
    field = str(error["loc"][0]) if error["loc"] else ""
    message = error["msg"].removeprefix("Value error, ")
    context = error.get("ctx", {})
    if error["type"] == "missing" or context.get("min_length") == 1:
        message = "is required"
    elif error["type"] in ("too_short", "string_too_short"):
        message = f"must be at least {context['min_length']} characters"
    elif error["type"] in ("too_long", "string_too_long"):
        message = f"must be at most {context['max_length']} characters"
    label = _LABELS.get(field)
    return f"{label}: {message}." if label else f"{message[:1].upper()}{message[1:]}."


class NewUserForm(BaseModel):
    """An operator's new user: email, plan, and a console password if they are to sign in."""

    model_config = ConfigDict(extra="ignore")

    email: Email
    plan: PlanName
    password: Password | None = None

    @field_validator("password", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value


class RoleForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Role


def whole_number(value: str | None, name: str, most: int) -> int | None:
    """A parameter that must be a whole number from 0 to `most`, as a 400 page when it is not."""
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit()) or int(value) > most:
        raise HTTPException(400, f"'{name}' must be a whole number from 0 to {most}.")
    return int(value)


def grace_hours(form: Mapping[str, object]) -> int:
    """A rotate form's choice: the hours the old key keeps working (24 when not given)."""
    hours = whole_number(str(form.get("grace_hours", "")), "grace_hours", MAX_GRACE_S // 3600)
    return DEFAULT_GRACE_S // 3600 if hours is None else hours
