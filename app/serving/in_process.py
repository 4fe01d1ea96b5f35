"""A model type whose engine runs in the ingress's own process (`in_ingress`): no Serve call
between them.

On one machine a token's path is then `vllm serve`'s (engine core, one serving process, the
client's connection), and a new request starts without waiting on a second process's event
loop (bench/NOTES.md, "where a stream's first token waits"). Everything after dispatch is as
for a deployed type: the same parts (deployments.wire), the same errors, the same priority
gate (in the engine); what Serve did for a deployment is done here: a bound on the requests
it holds (`max_ongoing_requests` + `max_queued_requests`, then 503 `model_overloaded`), and
the ingress's health check fails with the engine, so that Serve replaces the ingress.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from typing import Any

from app.limits.ticket import Meter
from app.openai.errors import ApiError
from app.serving.dispatch import ModelEndpoint, ReplicaLost, count_failure, joined, overloaded
from deployments.model_server import start_engine
from deployments.model_type import ModelTypeConfig
from deployments.wire import Api, EngineFailed, ModelInfo, ReplyPart

ENGINE = "the ingress's engine"
"""What a failure of a type's engine in the ingress names as its replica."""


class LocalParts:
    """A stream's parts after its first, straight from the engine's serving layer; `cancel`
    (the client left) aborts the engine's request."""

    __slots__ = ("_parts", "_done")

    def __init__(self, parts: AsyncIterator[ReplyPart], done: Any) -> None:
        self._parts = parts
        self._done = done

    def __aiter__(self) -> LocalParts:
        return self

    async def __anext__(self) -> ReplyPart:
        try:
            part = await anext(self._parts)
        except BaseException:
            self._done()
            raise
        if part.last:  # the reader stops here: nothing after it frees the request's place
            self._done()
        return part

    def cancel(self) -> None:
        self._done()
        parts: Any = self._parts
        # A generator that runs is awaited by a task whose cancellation aborts the request.
        if not parts.ag_running:
            asyncio.ensure_future(parts.aclose())


class LocalEndpoint(ModelEndpoint):
    """A model type served by an engine in this process (`engine`: a `VllmEngine`)."""

    def __init__(self, config: ModelTypeConfig, engine: Any) -> None:
        self.name = config.name
        self.handle = None
        self.engine = engine
        self._waiting = set()
        self._refused = weakref.WeakSet()
        self._held = 0
        queued = config.max_queued_requests
        self._most = None if queued == -1 else config.max_ongoing_requests + queued

    @classmethod
    async def start(cls, config: ModelTypeConfig) -> LocalEndpoint:
        return cls(config, await start_engine(config))

    def running(self) -> int | None:
        return 0 if self.engine.errored() else 1

    def error(self, exc: BaseException) -> ApiError:
        """As a deployed type's, naming this one engine where its failure names no replica:
        a request it failed has nowhere else to go on (app.serving.migration)."""
        error = super().error(exc)
        if isinstance(error, ReplicaLost) and error.replica is None:
            error.replica = ENGINE
        return error

    def _hold(self) -> None:
        """Take one of the requests the type may hold, as Serve's queue bound would."""
        if self._most is not None and self._held >= self._most:
            raise overloaded(self.name)
        self._held += 1

    def _release(self) -> None:
        self._held -= 1

    async def open_stream(
        self, api: Api, body: dict, meter: Meter, avoid: tuple[str, ...] = ()
    ) -> tuple[ReplyPart, LocalParts]:
        self._hold()
        released = False

        def done() -> None:
            nonlocal released
            if not released:
                released = True
                self._release()

        parts = self.engine.serve(api, body)
        try:
            first = await anext(parts)
        except BaseException as exc:
            done()
            count_failure(exc, meter)
            await parts.aclose()
            if isinstance(exc, StopAsyncIteration):
                raise self.error(EOFError("stream ended before its first part")) from None
            raise (self.error(exc) if isinstance(exc, Exception) else exc) from None
        meter.count(first)
        if first.last:
            done()
        return first, LocalParts(parts, done)

    async def reply(
        self, api: Api, body: dict, meter: Meter, avoid: tuple[str, ...] = ()
    ) -> ReplyPart:
        self._hold()
        try:
            whole = await joined(self.engine.serve(api, body), meter)
            if whole is None:
                raise EngineFailed("The model engine ended the request without a reply.")
            return whole
        except Exception as exc:
            count_failure(exc, meter)
            raise self.error(exc) from None
        finally:
            self._release()

    async def info(self) -> ModelInfo:
        return self.engine.info()

    async def prompt_tokens(self, api: Api, body: dict) -> int:
        try:
            return await self.engine.prompt_tokens(api, body)
        except Exception as exc:
            raise self.error(exc) from None

    async def check_health(self) -> None:
        """Raise if the engine core died: the ingress's health check then fails."""
        await self.engine.check_health()

    def shutdown(self) -> None:
        self.engine.shutdown()
