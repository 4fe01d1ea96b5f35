"""Redis goes away and comes back: clear 503s (or, by default, serving without limits) while it
is down, limits again once it is back, without restarting anything. The limiter talks to the
machine's Redis through a TCP proxy this test cuts (the shared server is never touched)."""

from __future__ import annotations

import secrets
from urllib.parse import urlsplit

import pytest

from app.limits.admission import UNLIMITED, RateLimits
from app.limits.counters import open_counters
from app.openai.errors import ApiError
from tests.app.shipped_plans import PLANS, PRO, caller
from tests.conftest import REDIS
from tests.tcp_proxy import TcpProxy


@pytest.mark.parametrize("fail_open", [False, True], ids=["closed", "open"])
async def test_redis_outage_then_recovery_without_restart(fail_open):
    server = urlsplit(REDIS)
    proxy = await TcpProxy(server.hostname, server.port or 6379).start()
    storage = open_counters(
        f"redis://127.0.0.1:{proxy.port}/0",
        key_prefix=f"sai-test-{secrets.token_hex(4)}",
        timeout_s=0.5,
    )
    limits = RateLimits(PLANS, storage, fail_open=fail_open)
    user = caller()
    try:
        assert await limits.admit(user, PRO, 10) is not UNLIMITED

        await proxy.cut()
        for _ in range(3):
            if fail_open:
                assert await limits.admit(user, PRO, 10) is UNLIMITED
            else:
                with pytest.raises(ApiError) as refused:
                    await limits.admit(user, PRO, 10)
                assert (refused.value.status, refused.value.code) == (
                    503,
                    "rate_limiter_unavailable",
                )
                assert int(refused.value.headers["Retry-After"]) > 0

        await proxy.restore()
        assert await limits.admit(user, PRO, 10) is not UNLIMITED
    finally:
        await limits.close()
        await storage.clear()
        await proxy.close()
