"""A background response (/v1/responses with `background: true`): admitted as any request,
answered at once with the response queued, then generated here and its end stored.

The stored row is its state (app.accounts.keystore.responses): any ingress replica answers
GET /v1/responses/{id} and its cancel, which this run sees within CANCEL_POLL_S and obeys by
closing the reply (the engine aborts the request). The ticket is charged once, as for any
whole reply, with what the engine generated before the end, cancellation included. An
ingress replica that stops with a background response still running stores it failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, TypeVar

from app.limits.ticket import Ticket
from app.openai.errors import ApiError
from app.serving.migration import Failover

if TYPE_CHECKING:
    from app.apis.responses.call import ResponsesCall

logger = logging.getLogger("ray.serve.serviceai")
CANCEL_POLL_S = 1.0
"""How often a running background response reads whether it was cancelled."""
T = TypeVar("T")
_RUNNING: set[asyncio.Task] = set()
"""The background responses this replica generates (the event loop keeps weak references)."""


class Cancelled(Exception):
    """The client cancelled the background response."""


def start(generation: Coroutine[None, None, None]) -> None:
    """Run a background response's `generation` after the request is answered, held until it
    ends."""
    task = asyncio.create_task(generation)
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)


async def generate(call: ResponsesCall, failover: Failover, ticket: Ticket) -> None:
    """Generate the response and store its end: on another replica, started over, where its
    own fails it (app.serving.migration)."""
    try:
        await call.started()
        async with ticket.charging() as meter:
            reply = failover.whole(meter)
            whole = await watched(call, reply)
            meter.charge()
        await call.whole(whole.data)
    except Cancelled:
        logger.info("Background response %s cancelled", call.response_id)
    except ApiError as error:
        await call.failed(error)
    except asyncio.CancelledError:
        stopped = ApiError(
            503,
            "The service stopped before this background response was finished: create it again.",
            code="service_unavailable",
        )
        await asyncio.shield(call.failed(stopped))
        raise
    except Exception:
        logger.exception("Background response %s failed", call.response_id)
        await call.failed(ApiError(500, "The response failed: create it again."))


async def watched(call: ResponsesCall, reply: Awaitable[T]) -> T:
    """The reply, or Cancelled once the stored response says cancelled (from any replica)."""
    task = asyncio.ensure_future(reply)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL_S)
            if done:
                return task.result()
            if await call.cancelled():
                raise Cancelled
    finally:
        if not task.done():
            task.cancel()  # closes the reply: the engine aborts the request
            await asyncio.wait({task})
