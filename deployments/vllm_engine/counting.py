"""The engine's own token counts for each API request, as vLLM's serving layer runs it.

Plans and usage are charged with what the engine processed, not with what the client got:
`CountingEngineClient` stands for the AsyncLLM that vLLM's serving layer calls, and adds every
engine request's prompt and generated tokens to the `EngineTokens` of the API request it
serves (one API request may start several: one per prompt of a /v1/completions list). Being
the one place every API's engine requests pass, it also sets how many tokens each streamed
chunk carries (deployments.priority_gate).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from vllm.engine.protocol import EngineClient
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

PROGRESS_S = 1.0
"""How often a whole reply's counts so far go to the ingress while the engine works on it."""


class EngineTokens:
    """Prompt and generated tokens of one API request, as the engine's outputs pass."""

    __slots__ = ("prompt", "completion")

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0


_counted: contextvars.ContextVar[EngineTokens] = contextvars.ContextVar("serviceai_tokens")


def count_this_request() -> EngineTokens:
    """The counts of the API request the current task serves, from zero; every engine request
    the serving layer starts from this task (and tasks it starts) adds to them."""
    tokens = EngineTokens()
    _counted.set(tokens)
    return tokens


def counting_client(
    engine: AsyncLLM, stream_interval: Callable[[int], int] | None = None
) -> EngineClient:
    """`engine` as the serving layer's EngineClient, counting (it forwards the rest as it is)."""
    return cast(EngineClient, CountingEngineClient(engine, stream_interval))


class CountingEngineClient:
    """The AsyncLLM the serving layer sees, with `generate` counting tokens per API request."""

    def __init__(
        self, engine: AsyncLLM, stream_interval: Callable[[int], int] | None = None
    ) -> None:
        """`stream_interval`: tokens per streamed chunk for an engine request's priority."""
        self._engine = engine
        self._stream_interval = stream_interval

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        count = _counted.get(None)
        kind = getattr(sampling_params, "output_kind", None)
        whole = count is not None and kind == RequestOutputKind.FINAL_ONLY
        if whole:
            # vLLM tells of a whole reply's tokens only at its end. Cumulative outputs say how
            # far the engine is at every step (what a client who leaves is charged); the
            # serving layer still gets one output at the end, every choice in it, as FINAL_ONLY
            # would give (which with n > 1 is every child's last output, merged).
            sampling_params.output_kind = kind = RequestOutputKind.CUMULATIVE
        if kind == RequestOutputKind.DELTA and self._stream_interval is not None:
            interval = self._stream_interval(kwargs.get("priority", 0))
            if interval > 1:
                sampling_params.stream_interval = max(
                    sampling_params.stream_interval or 1, interval
                )
        generator = self._engine.generate(prompt, sampling_params, request_id, *args, **kwargs)
        if count is None:
            async for output in generator:
                yield output
            return
        delta = kind == RequestOutputKind.DELTA
        seen: dict[int, int] = {}
        choices: dict[int, Any] = {}
        last = None
        async for output in generator:
            if last is None:
                count.prompt += len(output.prompt_token_ids or ())
            last = output
            for choice in output.outputs:
                tokens = len(choice.token_ids)
                if delta:
                    count.completion += tokens
                else:  # cumulative outputs: add what is new since the last
                    count.completion += tokens - seen.get(choice.index, 0)
                    seen[choice.index] = tokens
                if whole:
                    choices[choice.index] = choice
            if not whole:
                yield output
        if whole and last is not None:
            last.outputs = [choices[i] for i in sorted(choices)]
            yield last

    async def encode(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """An embedding's engine request: its prompt counted when its vector comes."""
        count = _counted.get(None)
        async for output in self._engine.encode(*args, **kwargs):
            if count is not None and output.finished:
                count.prompt += len(output.prompt_token_ids or ())
            yield output


class WholeReply:
    """A whole reply's one await of the serving layer, run as a task so that the request's
    token counts so far can go to the ingress meanwhile (what a client who leaves pays)."""

    def __init__(self, call: Awaitable[Any], count: EngineTokens) -> None:
        self._task = asyncio.ensure_future(call)
        self._count = count

    async def progress(self) -> AsyncIterator[tuple[int, int]]:
        """(prompt, completion) tokens so far every PROGRESS_S, once the engine has begun,
        until the call ends."""
        task, count = self._task, self._count
        while not task.done():
            await asyncio.wait((task,), timeout=PROGRESS_S)
            if not task.done() and count.prompt:
                yield count.prompt, count.completion

    def result(self) -> Any:
        return self._task.result()

    def cancel(self) -> None:
        """If it still runs (its caller left): cancelling vLLM's generator aborts the request."""
        if not self._task.done():
            self._task.cancel()
