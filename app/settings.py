"""Every environment setting of the service, in one place (prefix SERVICEAI_).

Secrets and per-environment addresses live here; the shape of the deployment (model types,
replicas, plans) lives in serve_config.yaml.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SERVICEAI_", extra="ignore")

    dev_api_key: SecretStr | None = Field(
        None, description="Development key accepted until the key store is configured."
    )
    public_base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="The base URL clients use; shown in messages."
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
