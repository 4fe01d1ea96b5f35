"""The plans of serve_config.yaml as the limit tests use them, and a caller on one of them."""

from __future__ import annotations

import secrets

from app.accounts.auth import Caller
from app.limits.plans import Plans
from tests.conftest import REDIS, app_args

REDIS_URL = REDIS
PLANS = Plans.model_validate(app_args()["plans"])
PRO = "ServiceAi-Pro"
FAST = "ServiceAi-Fast"


def caller(plan: str = "free") -> Caller:
    return Caller(key_id="key_x", user_id=f"user_{secrets.token_hex(6)}", plan=plan)
