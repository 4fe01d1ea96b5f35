"""Streaming clients that record exactly how each stream ended, read as raw SSE lines."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class StreamOutcome:
    """How one request ended, as the client saw it."""

    model: str
    status: int = 0
    retry_after: str | None = None
    error_code: str | None = None  # of the error envelope or the in-stream error event
    finish_reason: str | None = None
    done: bool = False  # the stream ended with `data: [DONE]`
    transport_error: str | None = None
    chunks: int = 0
    started_at: float = 0.0
    first_chunk_at: float = 0.0
    ended_at: float = 0.0

    @property
    def ttft_ms(self) -> float | None:
        """Time to the first chunk, for a stream that had one."""
        return 1000 * (self.first_chunk_at - self.started_at) if self.first_chunk_at else None

    @property
    def kind(self) -> str:
        """completed | error_event (+[DONE]) | refused_503 (with Retry-After) | broken."""
        if self.transport_error or (self.status == 200 and not self.done):
            return "broken"
        if self.status == 200:
            if self.error_code is None and self.finish_reason in ("stop", "length"):
                return "completed"
            return "error_event" if self.error_code else "broken"
        if self.status == 503 and self.retry_after and self.error_code:
            return "refused_503"
        return "broken"


async def stream_chat(
    client: httpx.AsyncClient,
    model: str,
    max_tokens: int,
    first_chunk: asyncio.Event | None = None,
    **body: Any,
) -> StreamOutcome:
    outcome = StreamOutcome(model, started_at=time.monotonic())
    request = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": max_tokens,
        "stream": True,
        **body,
    }
    try:
        async with client.stream("POST", "/v1/chat/completions", json=request) as response:
            outcome.status = response.status_code
            outcome.retry_after = response.headers.get("retry-after")
            if response.status_code != 200:
                outcome.error_code = json.loads(await response.aread())["error"]["code"]
                return outcome
            async for line in response.aiter_lines():
                if not line:
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    outcome.done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    outcome.error_code = event["error"]["code"]
                    continue
                outcome.chunks += 1
                outcome.first_chunk_at = outcome.first_chunk_at or time.monotonic()
                if first_chunk is not None and outcome.chunks == 2:
                    first_chunk.set()
                for choice in event["choices"]:
                    outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
    except (httpx.TransportError, json.JSONDecodeError, KeyError) as exc:
        outcome.transport_error = repr(exc)
    finally:
        outcome.ended_at = time.monotonic()
    return outcome


@dataclass
class Load:
    """`clients` streaming clients per model type, one request after another (with a short
    pause, as a client would), until stopped. `max_tokens` per type, else `default_tokens`."""

    origin: str
    api_key: str
    clients: dict[str, int]
    max_tokens: dict[str, int] = field(default_factory=dict)
    default_tokens: int = 32
    pause_s: float = 0.2
    outcomes: list[StreamOutcome] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    async def __aenter__(self) -> Load:
        self._client = httpx.AsyncClient(
            base_url=self.origin,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=httpx.Timeout(120, connect=10),
            limits=httpx.Limits(max_connections=100),
        )
        for model, count in self.clients.items():
            self._tasks += [asyncio.create_task(self._client_loop(model)) for _ in range(count)]
        return self

    async def _client_loop(self, model: str) -> None:
        while not self._stop.is_set():
            tokens = self.max_tokens.get(model, self.default_tokens)
            outcome = await stream_chat(self._client, model, tokens, ignore_eos=True)
            self.outcomes.append(outcome)
            await asyncio.sleep(self.pause_s if outcome.kind == "completed" else 1.0)

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._client.aclose()

    def tally(self, model: str) -> Counter:
        return Counter(o.kind for o in self.outcomes if o.model == model)

    def statuses(self, model: str) -> Counter:
        return Counter(o.status for o in self.outcomes if o.model == model)
