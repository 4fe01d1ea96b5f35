import pytest
from pydantic import SecretStr, ValidationError

from app.config.settings import DEFAULT_DATABASE_URL, PROJECT_ROOT, Settings


def test_defaults_are_a_local_sqlite_store_and_no_admin_api():
    settings = Settings(_env_file=None)
    assert settings.database_url.get_secret_value() == DEFAULT_DATABASE_URL
    assert DEFAULT_DATABASE_URL == f"sqlite+aiosqlite:///{PROJECT_ROOT}/.serviceai/serviceai.db"
    assert settings.admin_token is None
    assert 0 < settings.key_cache_ttl_s <= 10


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("sqlite:////tmp/x.db", "sqlite+aiosqlite:////tmp/x.db"),
        ("postgresql://u:pw@db:5432/keys", "postgresql+asyncpg://u:pw@db:5432/keys"),
        ("postgres://u@db/keys", "postgresql+asyncpg://u@db/keys"),
        ("postgresql+asyncpg://u@db/keys", "postgresql+asyncpg://u@db/keys"),
    ],
)
def test_database_urls_get_the_async_driver(given, used):
    assert Settings(database_url=given).database_url.get_secret_value() == used


def test_a_wrong_database_url_is_refused_without_showing_it():
    with pytest.raises(ValidationError) as info:
        Settings(database_url="mysql://root:hunter2@db/keys")
    assert "database_url" in str(info.value) and "hunter2" not in str(info.value)
    assert "hunter2" not in repr(Settings(database_url="postgresql://root:hunter2@db/keys"))


def test_the_admin_token_must_be_long_and_stays_secret():
    with pytest.raises(ValidationError, match="at least 24"):
        Settings(admin_token="short")
    assert Settings(admin_token="").admin_token is None
    token = "t" * 24
    settings = Settings(admin_token=token)
    assert settings.admin_token == SecretStr(token) and token not in repr(settings)


def test_console_settings_are_checked():
    settings = Settings(_env_file=None)
    assert settings.session_secret is None and settings.session_idle_s == 8 * 3600
    with pytest.raises(ValidationError, match="at least 32"):
        Settings(session_secret="short")
    assert Settings(session_secret="").session_secret is None
    with pytest.raises(ValidationError, match="rate limits such as"):
        Settings(sign_in_limit_per_email="lots")
    assert Settings(sign_in_limit_per_address="2/second;9/day").sign_in_limit_per_address
    with pytest.raises(ValidationError, match="public_base_url"):
        Settings(public_base_url="127.0.0.1:8000/v1")
