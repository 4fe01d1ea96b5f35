"""A request whose replica or engine failed it goes on on another replica (app.serving.migration):
what the next replica gets, what the client sees, what it is charged. Real Serve responses
around the replicas' answers (tests/app/serve_fakes.py); the engines die for real in
tests/e2e/test_failover.py."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest
from ray.exceptions import RayActorError

from app.limits.ticket import Meter
from app.openai.errors import ApiError
from app.serving import migration
from app.serving.dispatch import ModelEndpoint, ReplicaLost
from app.serving.migration import Attempts, ContinuedStream, resume_of
from deployments.wire import EngineFailed, InvalidGenerationRequest, ModelInfo, ReplyPart
from tests.app.serve_fakes import FakeHandle, serve_stream

MODEL = ModelInfo("T", 2048)
CHAT = {
    "model": "T",
    "messages": [{"role": "user", "content": "hi"}],
    "max_completion_tokens": 10,
    "temperature": 0.7,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def event(chunk: dict | str) -> bytes:
    return b"data: " + (chunk.encode() if isinstance(chunk, str) else orjson.dumps(chunk)) + b"\n\n"


def chat_chunk(reply_id: str, created: int, delta: dict, finish: str | None = None) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"id": reply_id, "object": "chat.completion.chunk", "created": created,
            "model": "T", "choices": [choice]}  # fmt: skip


def usage_chunk(reply_id: str, created: int, prompt: int, completion: int) -> dict:
    return {"id": reply_id, "object": "chat.completion.chunk", "created": created, "model": "T",
            "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}}  # fmt: skip


class RayTaskError(Exception):
    """A replica's exception as Ray raises it at the caller: the replica's in `cause`."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def failing(replica: str) -> RayTaskError:
    """An engine death as a replica raises it."""
    error = EngineFailed("The model engine stopped; the request was not completed.")
    error.replica = replica
    return RayTaskError(error)


class Replicas(FakeHandle):
    """A type's replicas as Serve answers: each stream call takes the next script (its parts,
    then what it raises), recording the body and the replicas passed over."""

    def __init__(self, scripts: list[tuple[list[ReplyPart], BaseException | None]]) -> None:
        super().__init__("T")
        self.scripts = scripts
        self.calls: list[tuple[dict, tuple]] = []
        self.stream = SimpleNamespace(remote=self._stream)
        self.reply = SimpleNamespace(remote=self._stream)

    def _stream(self, api, body, *args, avoid=()):
        self.calls.append((body, avoid))
        parts, then = self.scripts.pop(0)
        return serve_stream(parts, then)


def first_reply_parts() -> list[ReplyPart]:
    return [
        ReplyPart(event(chat_chunk("chatcmpl-1", 100, {"role": "assistant", "content": ""})), 7, 0),
        ReplyPart(event(chat_chunk("chatcmpl-1", 100, {"content": "Hello"})), 7, 1),
        ReplyPart(event(chat_chunk("chatcmpl-1", 100, {"content": " wor"})), 7, 2),
    ]


def continued_parts() -> list[ReplyPart]:
    """What the second replica streams for the continuation: its own id, its own counts."""
    return [
        ReplyPart(
            event(chat_chunk("chatcmpl-2", 200, {"role": "assistant", "content": ""})), 10, 0
        ),
        ReplyPart(event(chat_chunk("chatcmpl-2", 200, {"content": "ld"})), 10, 1),
        ReplyPart(
            event(chat_chunk("chatcmpl-2", 200, {"content": "!"}, "length"))
            + event(usage_chunk("chatcmpl-2", 200, 10, 8))
            + event("[DONE]"),
            10,
            8,
            last=True,
        ),
    ]


def meter() -> Meter:
    return Meter(lambda prompt, completion: None)


async def relay(replicas: Replicas, payload: dict, attempts: int = 2) -> tuple[list, Meter]:
    endpoint = ModelEndpoint("T", replicas)
    counted = meter()
    tries = Attempts(attempts)
    first, parts = await migration.open_stream(endpoint, "chat", payload, counted, tries)
    stream = ContinuedStream(
        endpoint, "chat", first, parts, counted, tries, resume_of("chat", payload, MODEL)
    )
    received = [first]
    try:
        async for part in stream:
            counted.count(part)
            received.append(part)
            if part.last:
                break  # as the pipeline's relay: the reply is complete
    except BaseException as exc:  # what the pipeline frames as the stream's error event
        received.append(exc)
    return received, counted


def text_and_events(received: list) -> tuple[str, list[dict]]:
    chunks = [orjson.loads(e) for p in received if isinstance(p, ReplyPart)
              for e in migration.sse_events(p.data) if e != b"[DONE]"]  # fmt: skip
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
    return text, chunks


async def test_a_stream_cut_mid_reply_goes_on_on_another_replica_as_one_reply():
    replicas = Replicas([(first_reply_parts(), failing("r1")), (continued_parts(), None)])
    received, counted = await relay(replicas, CHAT)
    text, chunks = text_and_events(received)
    assert text == "Hello world!"
    assert {(c["id"], c["created"]) for c in chunks} == {("chatcmpl-1", 100)}
    assert sum("role" in c["choices"][0]["delta"] for c in chunks if c["choices"]) == 1
    assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17}
    assert received[-1].last and (received[-1].prompt_tokens, received[-1].completion_tokens) == (
        7,
        10,
    )
    assert (counted.prompt_tokens, counted.completion_tokens) == (7, 10)  # charged once
    body, avoid = replicas.calls[1]
    assert avoid == ("r1",)
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello wor"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_completion_tokens"] == 8 and body["temperature"] == 0.7


async def test_a_stream_that_cannot_go_on_faithfully_ends_with_its_error_charged_what_was_sent():
    replicas = Replicas([(first_reply_parts(), failing("r1"))])
    received, counted = await relay(replicas, {**CHAT, "n": 2})
    assert isinstance(received[-1], RayTaskError)  # raised as it came: the pipeline frames it
    assert len(replicas.calls) == 1
    assert (counted.prompt_tokens, counted.completion_tokens) == (7, 2)


async def test_attempts_are_bounded_and_a_dead_replica_is_passed_over():
    replicas = Replicas(
        [
            (first_reply_parts(), failing("r1")),
            ([], RayActorError()),  # the next replica dies before its first part: starts over
            (continued_parts(), None),
        ]
    )
    received, _ = await relay(replicas, CHAT)
    assert text_and_events(received)[0] == "Hello world!"
    replicas = Replicas([(first_reply_parts(), failing("r1")), ([], RayActorError())])
    received, _ = await relay(replicas, CHAT, attempts=1)
    assert isinstance(received[-1], ReplicaLost)


async def test_a_refusal_is_no_failover():
    replicas = Replicas([([], RayTaskError(InvalidGenerationRequest("too long")))])
    with pytest.raises(ApiError) as refused:
        await relay(replicas, CHAT)
    assert refused.value.status == 400 and len(replicas.calls) == 1


async def test_a_whole_reply_starts_over_and_is_charged_for_the_one_the_client_gets():
    body = ReplyPart(b'{"id": "chatcmpl-3"}', 7, 5, last=True)
    replicas = Replicas([([ReplyPart(b"", 7, 3)], failing("r1")), ([body], None)])
    counted = meter()
    whole = await migration.whole_reply(
        ModelEndpoint("T", replicas), "chat", CHAT, counted, Attempts(2)
    )
    assert whole.data == body.data and replicas.calls[1][1] == ("r1",)
    assert (counted.prompt_tokens, counted.completion_tokens) == (7, 5)


@pytest.mark.parametrize(
    "payload, reason",
    [
        ({**CHAT, "logprobs": True}, "logprobs"),
        ({**CHAT, "tools": [{"type": "function"}]}, "tools"),
        ({**CHAT, "response_format": {"type": "json_object"}}, "structured output"),
        ({**CHAT, "structured_outputs": {"regex": "a+"}}, "structured output"),
    ],
)
def test_what_cannot_go_on_says_why(payload, reason):
    assert reason in resume_of("chat", payload, MODEL)([], 0)
    assert "reasoning" in resume_of("chat", CHAT, ModelInfo("T", 64, reasoning_parser="qwen3"))(
        [], 0
    )
    assert "items" in resume_of("responses", CHAT, MODEL)([], 0)


def test_a_chat_reply_that_called_a_tool_is_not_continued():
    call = {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}
    sent = [
        event(chat_chunk("c", 1, {"role": "assistant", "content": ""})),
        event(chat_chunk("c", 1, call)),
    ]
    assert "tool calls" in resume_of("chat", CHAT, MODEL)(sent, 1)


def test_a_completion_goes_on_after_its_prompt_and_token_ids_do_not():
    payload = {"model": "T", "prompt": "Once", "max_tokens": 6, "stream": True}
    sent = [event({"id": "cmpl-1", "created": 5, "choices": [{"index": 0, "text": " upon"}]})]
    continuation = resume_of("completion", payload, MODEL)(sent, 1)
    assert continuation.payload["prompt"] == "Once upon" and continuation.payload["max_tokens"] == 5
    assert "token ids" in resume_of("completion", {**payload, "prompt": [1, 2]}, MODEL)(sent, 1)
