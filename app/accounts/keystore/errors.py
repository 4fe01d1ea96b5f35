"""What the key store refuses, with the HTTP status and OpenAI error code each maps to."""

from __future__ import annotations


class KeyStoreError(Exception):
    status = 400
    code = "invalid_value"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class UserNotFound(KeyStoreError):
    status = 404
    code = "user_not_found"


class KeyNotFound(KeyStoreError):
    status = 404
    code = "api_key_not_found"


class UserExists(KeyStoreError):
    status = 409
    code = "user_exists"


class UserDisabled(KeyStoreError):
    status = 409
    code = "user_disabled"


class KeyLimitReached(KeyStoreError):
    status = 409
    code = "api_key_limit_reached"


class WrongCredentials(KeyStoreError):
    """An email and password that do not match a user (which of the two is never said)."""

    status = 401
    code = "invalid_credentials"


class StoreUnavailable(KeyStoreError):
    """The database cannot be reached; the caller may retry."""

    status = 503
    code = "key_store_unavailable"


class AdapterNotFound(KeyStoreError):
    status = 404
    code = "adapter_not_found"


class AdapterExists(KeyStoreError):
    status = 409
    code = "adapter_exists"
