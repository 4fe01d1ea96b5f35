"""One request's charge, from admission to the usage meter: open, shape, charge once.

    ticket = await limits.open(caller, model_type, reply, model=info, usage=usage_meter)
    ticket.shape(payload, reply, info)                     # the cap and priority it sets
    async with ticket.charging() as meter:                 # settles once on every exit
        whole = await endpoint.reply(api, payload, meter)  # the engine's counts, as they come

`limits.open` checks every window and reserves the reply (`app.limits.admission`). The meter
holds what the engine has processed so far (a reply's parts and a failure declare their
token counts); the ticket charges it once: to the plan's counters (the reservation replaced
by the real tokens, the concurrency slot freed) and to the key's usage. Leaving the block
charges it, however it is left (a reply, an error, a cancelled task: the client went away),
and an error leaves with the plan's rate-limit headers once the slot is free. A stream
charges it on its own end (`Meter.handed_to_stream`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol

from app.openai.errors import ApiError

if TYPE_CHECKING:
    from app.limits.admission import Admission
    from app.limits.usage_meter import UsageMeter
    from app.openai.protocol import ReplyLength
    from deployments.wire import ModelInfo

SETTLE_WAIT_S = 1.0
"""The longest a reply's last bytes wait for its slot to be freed (a storage that does not
answer delays no reply longer)."""


Charge = Callable[[int, int], asyncio.Future[None]]
"""Charges (prompt, completion) tokens to a request's limits and usage; done when its
concurrency slot is free."""


class Counted(Protocol):
    """What the engine processed for a request so far: a reply's part, or its failure."""

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...


class Ticket:
    """An admitted request: the rate-limit headers its responses carry, what it sets in the
    engine's payload, and its one charge."""

    __slots__ = ("headers", "_admission", "_usage", "_key_id", "_model", "_priority")

    def __init__(
        self,
        admission: Admission,
        usage: UsageMeter | None,
        key_id: str,
        model: str,
        priority: int,
    ) -> None:
        self.headers = admission.headers
        self._admission = admission
        self._usage = usage
        self._key_id = key_id
        self._model = model  # usage is recorded under it: a type, or an adapter
        self._priority = priority

    def shape(self, payload: dict, reply: ReplyLength, model: ModelInfo) -> None:
        """Set what the plan decides in the engine's payload: a reply with no limit of its own
        runs no further than the plan has left (in `reply.field`), and an engine that orders
        requests by priority gets the plan's."""
        longest = self._admission.reply_length(model.max_model_len)
        if reply.each is None and longest is not None:
            payload[reply.field] = longest
        if model.priority_scheduling:
            payload["priority"] = self._priority

    @asynccontextmanager
    async def charging(self) -> AsyncIterator[Meter]:
        """A meter for the engine's counts, charged once when the block is left; an `ApiError`
        leaves with the plan's headers, once the slot is free."""
        meter = Meter(self._charge)
        try:
            yield meter
        except BaseException as error:
            charged = meter.charge()
            if isinstance(error, ApiError):
                error.headers.update(self.headers)
                await settled(charged)
            raise
        if not meter.streaming:
            await meter.settle()

    def _charge(self, prompt_tokens: int, completion_tokens: int) -> asyncio.Future[None]:
        if self._usage is not None and (prompt_tokens or completion_tokens):
            self._usage.record(self._key_id, self._model, prompt_tokens, completion_tokens)
        return self._admission.settle(prompt_tokens, completion_tokens)


class Meter:
    """What the engine has processed for one request so far, charged to its ticket once."""

    __slots__ = ("prompt_tokens", "completion_tokens", "streaming", "_charge", "_charged")

    def __init__(self, charge: Charge) -> None:
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.streaming = False
        self._charge = charge
        self._charged: asyncio.Future[None] | None = None

    def count(self, counted: Counted) -> None:
        """The engine's counts for the whole request so far (they only grow)."""
        self.prompt_tokens = max(self.prompt_tokens, counted.prompt_tokens)
        self.completion_tokens = max(self.completion_tokens, counted.completion_tokens)

    def reset(self, counted: Counted | None = None) -> None:
        """The counts go back to `counted`'s (none: zero): what the client received of a
        reply that goes on, or starts over, on another replica (app.serving.migration)."""
        self.prompt_tokens = counted.prompt_tokens if counted else 0
        self.completion_tokens = counted.completion_tokens if counted else 0

    def handed_to_stream(self) -> None:
        """The reply goes on as a stream, which charges the meter when it ends or closes."""
        self.streaming = True

    def charge(self) -> asyncio.Future[None]:
        """Charge what is counted (once; later calls get the first charge); done when the
        concurrency slot is free."""
        if self._charged is None:
            self._charged = self._charge(self.prompt_tokens, self.completion_tokens)
        return self._charged

    async def settle(self) -> None:
        """Charge, and wait until the slot is free (before the client can read the end)."""
        await settled(self.charge())


async def settled(written: asyncio.Future[None]) -> None:
    """Wait until a charge is written, at most SETTLE_WAIT_S."""
    await asyncio.wait([written], timeout=SETTLE_WAIT_S)
