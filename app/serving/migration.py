"""A request whose replica or engine failed it goes on on another replica: nothing lost,
nothing repeated, no error for the client.

A failure that another replica can make good (`dispatch.ReplicaLost`: the engine died or
failed the request, the replica or its serving process died, the stream from it broke) is
tried again on another replica of the type, passing over those that failed it (the request
router's `AVOID`), at most `attempts` times (SERVICEAI_MIGRATION_ATTEMPTS), never for a
client that left (its task is cancelled first). What the client has seen decides how:

- nothing (a whole reply, or a stream before its first part): the request starts over;
- part of a stream: it continues. The new replica gets the prompt plus the text already
  sent (chat: as the assistant's message it continues, vLLM's `continue_final_message`;
  Messages: as a final assistant message, Anthropic's prefill; Responses: as a final
  assistant message `in_progress`; completions: after the prompt), the rest of the length
  budget and the same sampling. Its events are rewritten as the first reply's: chat and
  completions keep the first id and creation time with no second role chunk; Messages no
  second `message_start` or opening of the text block; Responses the first response's id,
  creation time and message item, sequence numbers going on, and the done events' text
  whole. Its usage counts the prompt once and every completion token the client received.
  The re-prefill is the service's cost.

A continuation would not be faithful, and the stream ends with its error as before, where
the reply holds more than text (`n` > 1, logprobs, tool calls, reasoning, structured output
half sent, `echo`, a suffix, a prompt of token ids: docs/operations.md). Each migration is
logged and counted (`serviceai_migrations` by model type, API and kind: `restart`,
`continue`, or `refused` with the reason logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from ray.util.metrics import Counter

from app.limits.ticket import Meter
from app.openai.errors import ApiError
from app.serving.dispatch import ModelEndpoint, PartStream, ReplicaLost
from deployments.wire import ModelInfo, ReplyPart

logger = logging.getLogger("ray.serve.serviceai")
T = TypeVar("T")

MIGRATIONS = Counter(
    "serviceai_migrations",
    description="Requests moved to another replica after theirs failed them, by model type, "
    "API and kind: `restart` (nothing was sent yet), `continue` (a stream went on from where "
    "it was cut), `refused` (a stream that could not go on faithfully: ended as before).",
    tag_keys=("model_type", "api", "kind"),
)


def moved(endpoint: ModelEndpoint, api: str, kind: str, lost: ReplicaLost, detail: str) -> None:
    MIGRATIONS.inc(tags={"model_type": endpoint.name, "api": api, "kind": kind})
    logger.warning(
        "Migration (%s) of a %s request on %s from replica %s: %s; %s",
        kind,
        api,
        endpoint.name,
        lost.replica or "unknown",
        lost.message,
        detail,
    )


class Attempts:
    """What one request may still try: `left` more replicas, passing over `avoid`."""

    __slots__ = ("left", "avoid")

    def __init__(self, left: int) -> None:
        self.left = left
        self.avoid: tuple[str, ...] = ()

    def take(self, lost: ReplicaLost, endpoint: ModelEndpoint) -> bool:
        """Whether the request may go on elsewhere after `lost` (an attempt is spent): not
        where the type runs no replica but those that failed it (a type of one replica whose
        engine died: Serve replaces it, and the client hears so rather than wait)."""
        avoid = self.avoid if lost.replica is None else (*self.avoid, lost.replica)
        running = endpoint.running()
        if self.left <= 0 or (running is not None and running <= len(avoid)):
            return False
        self.left -= 1
        self.avoid = avoid
        return True


async def whole_reply(
    endpoint: ModelEndpoint, api: str, payload: dict, meter: Meter, attempts: Attempts
) -> ReplyPart:
    """`endpoint.reply`, started over on another replica while one fails it: the client saw
    nothing, and is charged only what the reply it gets cost."""
    return await _started_over(
        lambda avoid: endpoint.reply(api, payload, meter, avoid),
        endpoint,
        api,
        meter,
        attempts,
        "a whole reply, started over",
    )


async def open_stream(
    endpoint: ModelEndpoint, api: str, payload: dict, meter: Meter, attempts: Attempts
) -> tuple[ReplyPart, PartStream]:
    """`endpoint.open_stream`, started over on another replica while one fails it before the
    stream's first part."""
    return await _started_over(
        lambda avoid: endpoint.open_stream(api, payload, meter, avoid),
        endpoint,
        api,
        meter,
        attempts,
        "a stream before its first part, started over",
    )


async def _started_over(
    call: Callable[[tuple[str, ...]], Awaitable[T]],
    endpoint: ModelEndpoint,
    api: str,
    meter: Meter,
    attempts: Attempts,
    what: str,
) -> T:
    """`call` (given the replicas to pass over), again while a replica fails it and attempts
    are left; each failed try is charged nothing."""
    while True:
        try:
            return await call(attempts.avoid)
        except ReplicaLost as lost:
            if not attempts.take(lost, endpoint):
                raise
            meter.reset()
            moved(endpoint, api, "restart", lost, what)


Continue = Callable[[list[bytes], int], "Continuation | str"]
"""What an API does with a stream cut after the events `sent` (their bytes, as relayed) and
`received` completion tokens: the continuation, or why there is none."""


class Continuation:
    """How a cut stream goes on: the payload that continues it, and the new replica's parts
    as the client must see them (one reply: the first's identity, counts and events)."""

    def __init__(self, payload: dict, received: int) -> None:
        self.payload = payload
        self.received = received
        self.prompt_tokens = 0  # the first reply's prompt: set by the stream that goes on

    def part(self, part: ReplyPart) -> ReplyPart:
        """A part of the new replica's stream as the first replica's would have been."""
        data = b"".join(self.event(name, data) for name, data in sse_blocks(part.data))
        return part._replace(
            data=data,
            final=None if part.final is None else orjson.dumps(self.rewritten(part.final)),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.received + part.completion_tokens,
        )

    def event(self, name: bytes | None, data: bytes) -> bytes:
        """One event of the new stream as the client gets it (b"" for none)."""
        if data == b"[DONE]":
            return b"data: [DONE]\n\n"
        event = self.kept(orjson.loads(data))
        if event is None:
            return b""
        head = b"event: " + name + b"\n" if name is not None else b""
        return head + b"data: " + orjson.dumps(event) + b"\n\n"

    def kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        raise NotImplementedError

    def rewritten(self, final: bytes) -> dict[str, Any]:
        """A /v1/responses stream's terminal event (held apart: the ingress stores it)."""
        raise NotImplementedError

    def usage(self, usage: dict[str, Any] | None, prompt: str, completion: str, total: str) -> None:
        """The reply's usage as one reply's: the first prompt, every completion token."""
        if not usage:
            return
        usage[prompt] = self.prompt_tokens
        usage[completion] = self.received + (usage.get(completion) or 0)
        if total:
            usage[total] = usage[prompt] + usage[completion]
        for details in (usage.get("prompt_tokens_details"), usage.get("input_tokens_details")):
            if details and details.get("cached_tokens"):
                details["cached_tokens"] = min(details["cached_tokens"], self.prompt_tokens)


class ChunkContinuation(Continuation):
    """Chat and completion chunks: the first reply's id and creation time, no second role."""

    def __init__(self, payload: dict, sent: list[bytes], received: int) -> None:
        super().__init__(payload, received)
        self._id, self._created = first_identity(sent)
        self._opened = False

    def kept(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        chunk["id"], chunk["created"] = self._id, self._created
        self.usage(chunk.get("usage"), "prompt_tokens", "completion_tokens", "total_tokens")
        if self._opened:
            return chunk
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if delta is not None and "role" in delta:
                # The new reply's opening chunk: the client had the role from the first one.
                self._opened = True
                del delta["role"]
                keep = bool(delta.get("content")) or choice.get("finish_reason") is not None
                return chunk if keep else None
        self._opened = bool(chunk.get("choices"))
        return chunk


class MessagesContinuation(Continuation):
    """Anthropic's events: the message and its text block were opened by the first reply."""

    def __init__(self, payload: dict, received: int, block_open: bool) -> None:
        super().__init__(payload, received)
        self._block_open = block_open

    def kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        if kind == "message_start" or (kind == "content_block_start" and self._block_open):
            return None
        if kind == "message_delta":
            self.usage(event.get("usage"), "input_tokens", "output_tokens", "")
        return event


class ResponsesContinuation(Continuation):
    """OpenAI's Responses events: the first response's id, creation time and output item, its
    sequence numbers going on, and the done events' text whole."""

    def __init__(self, payload: dict, received: int, first: dict, said: str) -> None:
        super().__init__(payload, received)
        self._response = first["response"]
        self._item = first["item"]
        self._part_open = first["part_open"]
        self._sequence = first["sequence"]
        self._said = said

    def kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        if kind in ("response.created", "response.in_progress"):
            return None
        if kind == "response.output_item.added" and self._item is not None:
            return None
        if kind == "response.content_part.added" and self._part_open:
            return None
        return self._one_reply(event)

    def rewritten(self, final: bytes) -> dict[str, Any]:
        return self._one_reply(orjson.loads(final))

    def _one_reply(self, event: dict[str, Any]) -> dict[str, Any]:
        self._sequence += 1
        event["sequence_number"] = self._sequence
        if self._item is not None and "item_id" in event:
            event["item_id"] = self._item
        if "text" in event:  # response.output_text.done
            event["text"] = self._said + event["text"]
        if (event.get("part") or {}).get("type") == "output_text":
            event["part"]["text"] = self._said + event["part"]["text"]
        if "item" in event:
            self._whole(event["item"])
        response = event.get("response")
        if response is not None:
            response["id"] = self._response["id"]
            response["created_at"] = self._response["created_at"]
            for item in response.get("output") or ():
                self._whole(item)
            self.usage(response.get("usage"), "input_tokens", "output_tokens", "total_tokens")
        return event

    def _whole(self, item: dict[str, Any]) -> None:
        if item.get("type") != "message":
            return
        if self._item is not None:
            item["id"] = self._item
        texts = [c for c in item.get("content") or () if c.get("type") == "output_text"]
        if texts:
            texts[0]["text"] = self._said + texts[0]["text"]


class ContinuedStream:
    """A stream's parts after its first, going on on another replica when its own fails it
    (`resume`: the continuation, or why there is none). A failure it cannot make good is
    raised as it came."""

    def __init__(
        self,
        endpoint: ModelEndpoint,
        api: str,
        first: ReplyPart,
        parts: PartStream,
        meter: Meter,
        attempts: Attempts,
        resume: Continue,
    ) -> None:
        self._endpoint = endpoint
        self._api = api
        self._parts = parts
        self._meter = meter
        self._attempts = attempts
        self._resume = resume
        self._sent = [first.data]
        self._last = first
        self._continuation: Continuation | None = None
        self._opening: ReplyPart | None = None

    def __aiter__(self) -> ContinuedStream:
        return self

    async def __anext__(self) -> ReplyPart:
        while self._opening is None:
            try:
                part = await anext(self._parts)
            except StopAsyncIteration:
                if self._last.last:
                    raise
                if not await self._went_on(self._endpoint.error(EOFError("cut short"))):
                    raise
                continue
            except Exception as exc:
                if not await self._went_on(self._endpoint.error(exc)):
                    raise
                continue
            if self._continuation is not None:
                part = self._continuation.part(part)
            return self._sending(part)
        part, self._opening = self._opening, None
        return self._sending(part)

    def _sending(self, part: ReplyPart) -> ReplyPart:
        self._sent.append(part.data)
        self._last = part
        return part

    async def _went_on(self, lost: ApiError) -> bool:
        """Whether the stream went on on another replica after `lost` (its first part is
        next); False where it cannot (the failure is raised as it came)."""
        if not isinstance(lost, ReplicaLost) or not self._attempts.take(lost, self._endpoint):
            return False
        received = self._last.completion_tokens
        continuation = self._resume(self._sent, received)
        if isinstance(continuation, str):
            moved(self._endpoint, self._api, "refused", lost, continuation)
            return False
        # The prompt as last counted: a stream's first event can precede its prefill (a
        # Responses stream's `response.created` counts no prompt yet).
        continuation.prompt_tokens = self._last.prompt_tokens
        cut = time.perf_counter()
        try:
            first, self._parts = await open_stream(
                self._endpoint, self._api, continuation.payload, self._meter, self._attempts
            )
        finally:
            self._meter.reset(self._last)  # the client is charged what it receives
        self._continuation = continuation
        self._opening = continuation.part(first)
        moved(
            self._endpoint,
            self._api,
            "continue",
            lost,
            f"went on after {received} tokens, {1000 * (time.perf_counter() - cut):.0f} ms later",
        )
        return True

    def cancel(self) -> None:
        self._parts.cancel()


def resume_of(api: str, payload: dict, model: ModelInfo) -> Continue:
    """How a cut stream of `api` goes on, or why it cannot (always, or once its events show
    more than text)."""
    if api == "chat":
        refusal = chat_refusal(payload, model)
        return _refused(refusal) if refusal else lambda sent, n: chat_continuation(payload, sent, n)
    if api == "completion":
        refusal = completion_refusal(payload)
        if refusal:
            return _refused(refusal)
        return lambda sent, n: completion_continuation(payload, sent, n)
    if api == "messages":
        refusal = messages_refusal(payload, model)
        if refusal:
            return _refused(refusal)
        return lambda sent, n: messages_continuation(payload, sent, n)
    if api == "responses":
        refusal = responses_refusal(payload, model)
        if refusal:
            return _refused(refusal)
        return lambda sent, n: responses_continuation(payload, sent, n)
    return _refused(f"a {api} request is not streamed")


def _refused(reason: str) -> Continue:
    return lambda sent, received: reason


def chat_refusal(payload: dict, model: ModelInfo) -> str | None:
    """Why no chat stream of `payload` can go on elsewhere faithfully, or None."""
    if model.reasoning_parser:
        return "a reasoning model's reply (its reasoning is parsed from the whole output)"
    if payload.get("tools") and payload.get("tool_choice") != "none":
        return "a reply that may call tools"
    format_type = (payload.get("response_format") or {}).get("type", "text")
    return _common_refusal(payload) or (
        "structured output half sent" if format_type != "text" else None
    )


def messages_refusal(payload: dict, model: ModelInfo) -> str | None:
    """Why no Messages stream of `payload` can go on elsewhere faithfully, or None."""
    if model.reasoning_parser:
        return "a reasoning model's reply (its reasoning is parsed from the whole output)"
    if payload.get("tools") and (payload.get("tool_choice") or {}).get("type") != "none":
        return "a reply that may call tools"
    if (payload.get("output_config") or {}).get("format"):
        return "structured output half sent"
    return None


def responses_refusal(payload: dict, model: ModelInfo) -> str | None:
    """Why no Responses stream of `payload` can go on elsewhere faithfully, or None."""
    if model.reasoning_parser:
        return "a reasoning model's reply (its reasoning is parsed from the whole output)"
    if payload.get("tools") and payload.get("tool_choice") != "none":
        return "a reply that may call tools"
    if ((payload.get("text") or {}).get("format") or {}).get("type", "text") != "text":
        return "structured output half sent"
    if payload.get("top_logprobs") or any("logprobs" in i for i in payload.get("include") or ()):
        return "logprobs"
    return None


def completion_refusal(payload: dict) -> str | None:
    """Why no completion stream of `payload` can go on elsewhere faithfully, or None."""
    prompt = payload.get("prompt")
    if not isinstance(prompt, str) and not (
        isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
    ):
        return "a prompt of token ids, or several prompts"
    if payload.get("suffix"):
        return "a suffix"
    return _common_refusal(payload)


def _common_refusal(payload: dict) -> str | None:
    if (payload.get("n") or 1) > 1:
        return "n > 1"
    if payload.get("logprobs") or payload.get("top_logprobs") or payload.get("prompt_logprobs"):
        return "logprobs"
    if payload.get("echo"):
        return "echo"
    if payload.get("structured_outputs"):
        return "structured output half sent"
    return None


def chat_continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The chat request that goes on from the text `sent` (the assistant's message to
    continue), or why there is none (the reply held more than text)."""
    text = []
    for chunk in chunks(sent):
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("tool_calls") or delta.get("reasoning") or delta.get("reasoning_content"):
                return "a reply that holds tool calls or reasoning"
            if choice.get("finish_reason") is not None:
                return "a reply already finished"
            text.append(delta.get("content") or "")
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    said = "".join(text)
    messages = list(payload["messages"])
    if payload.get("continue_final_message"):
        last = messages[-1]
        if not isinstance(last.get("content"), str):
            return "a final message of parts to continue"
        messages[-1] = {**last, "content": last["content"] + said}
    elif said:
        messages.append({"role": "assistant", "content": said})
        body["add_generation_prompt"] = False
        body["continue_final_message"] = True
    body["messages"] = messages
    return ChunkContinuation(body, sent, received)


def completion_continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The completion request that goes on from the text `sent`, after its prompt."""
    text = []
    for chunk in chunks(sent):
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason") is not None:
                return "a reply already finished"
            text.append(choice.get("text") or "")
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    prompt = payload["prompt"]
    body["prompt"] = (prompt if isinstance(prompt, str) else prompt[0]) + "".join(text)
    return ChunkContinuation(body, sent, received)


def messages_continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The Messages request that goes on from the text `sent`: a final assistant message
    (Anthropic's prefill, which the replica continues), or why there is none."""
    text, block_open = [], False
    for event in chunks(sent):
        kind = event.get("type")
        if kind == "content_block_start":
            if event.get("index") != 0 or event["content_block"].get("type") != "text":
                return "a reply that holds more than one text block"
            block_open = True
        elif kind == "content_block_delta":
            if event["delta"].get("type") != "text_delta":
                return "a reply that holds more than text"
            text.append(event["delta"]["text"])
        elif kind in ("content_block_stop", "message_delta", "message_stop"):
            return "a reply already finished"
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    said = "".join(text)
    messages = list(payload["messages"])
    if said and messages[-1].get("role") == "assistant":  # the client's own prefill
        content = messages[-1]["content"]
        if not isinstance(content, str):
            return "a final message of blocks to continue"
        messages[-1] = {**messages[-1], "content": content + said}
    elif said:
        messages.append({"role": "assistant", "content": said})
    body["messages"] = messages
    return MessagesContinuation(body, received, block_open)


def responses_continuation(payload: dict, sent: list[bytes], received: int) -> Continuation | str:
    """The Responses request that goes on from the text `sent`: a final assistant message in
    progress (which vLLM's Responses handler continues), or why there is none."""
    first: dict[str, Any] = {"response": None, "item": None, "part_open": False, "sequence": -1}
    text = []
    for event in chunks(sent):
        kind = event.get("type")
        first["sequence"] = max(first["sequence"], event.get("sequence_number", -1))
        if kind == "response.created":
            first["response"] = event["response"]
        elif kind == "response.output_item.added":
            if event.get("output_index") != 0 or event["item"].get("type") != "message":
                return "a reply that holds more than one message"
            first["item"] = event["item"]["id"]
        elif kind == "response.content_part.added":
            if event.get("content_index") != 0:
                return "a reply that holds more than one part"
            first["part_open"] = True
        elif kind == "response.output_text.delta":
            text.append(event["delta"])
        elif kind != "response.in_progress":
            return "a reply that holds more than text, or is finished"
    if first["response"] is None:
        return "a stream that never started"
    body = shortened(payload, received)
    if isinstance(body, str):
        return body
    said = "".join(text)
    if said:
        given = payload["input"]
        items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        item = {"type": "message", "id": first["item"], "role": "assistant"}
        item |= {"status": "in_progress", "content": [_output_text(said)]}
        body["input"] = [*items, item]
    return ResponsesContinuation(body, received, first, said)


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def shortened(payload: dict, received: int) -> dict | str:
    """`payload` with `received` tokens less to generate (and to generate at least)."""
    body = dict(payload)
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if body.get(field) is not None:
            body[field] -= received
            if body[field] <= 0:
                return "a reply whose length budget is spent"
    if body.get("min_tokens"):
        body["min_tokens"] = max(0, body["min_tokens"] - received)
    return body


def chunks(sent: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(e) for data in sent for e in sse_events(data) if e != b"[DONE]"]


def sse_blocks(data: bytes) -> list[tuple[bytes | None, bytes]]:
    """The server-sent events in `data`: each one's `event:` name (None where it has none)
    and its `data:` payload."""
    blocks = []
    for block in data.split(b"\n\n"):
        name, payload = None, None
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip()
            elif line.startswith(b"data:"):
                payload = line[6:] if line.startswith(b"data: ") else line[5:]
        if payload is not None:
            blocks.append((name, payload))
    return blocks


def sse_events(data: bytes) -> list[bytes]:
    """The `data:` payloads of the server-sent events in `data`."""
    return [payload for _, payload in sse_blocks(data)]


def first_identity(sent: list[bytes]) -> tuple[str, int]:
    """The id and creation time of the reply whose events `sent` holds."""
    for data in sent:
        for event in sse_events(data):
            if event != b"[DONE]":
                chunk = orjson.loads(event)
                return chunk["id"], chunk["created"]
    raise ValueError("no event sent yet")
