"""The console's forms as pydantic models, and their errors as one sentence naming the field."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from app.accounts.keystore import passwords
from app.accounts.keystore.schemas import Email, KeyName, Password
_LABELS = {"email": "Email", "password": "Password", "password_again": "Repeat password",
           "name": "Key name"}


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
    model_config = ConfigDict(extra="ignore")

    name: KeyName


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
