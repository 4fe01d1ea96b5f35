"""A request whose replica or engine failed it goes on on another replica (app.serving.migration):
what the next replica gets, what the client sees, what it is charged. Real Serve responses
around the replicas' answers (tests/app/serve_fakes.py); the engines die for real in
tests/e2e/test_failover.py."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest
from ray.exceptions import RayActorError

from app.apis.chat import continuation as chat_continuation
from app.apis.chat.protocol import ChatCompletionRequest
from app.apis.completions import continuation as completions_continuation
from app.apis.completions.protocol import CompletionRequest
from app.apis.embeddings.call import EmbeddingsCall
from app.apis.embeddings.protocol import EmbeddingRequest
from app.apis.messages import continuation as messages_continuation
from app.apis.messages.protocol import MessagesRequest
from app.apis.responses import continuation as responses_continuation
from app.apis.responses.protocol import ResponseCreateRequest
from app.limits.ticket import Meter
from app.openai.errors import ApiError
from app.serving import migration
from app.serving.continuation import Continue, sse_events
from app.serving.dispatch import ModelEndpoint, ReplicaLost
from app.serving.migration import Attempts, ContinuedStream
from deployments.wire import EngineFailed, InvalidGenerationRequest, ModelInfo, ReplyPart
from tests.app.serve_fakes import FakeHandle, serve_stream

MODEL = ModelInfo("T", 2048)
RESUMES = {
    "chat": (ChatCompletionRequest, chat_continuation.resume),
    "completion": (CompletionRequest, completions_continuation.resume),
    "messages": (MessagesRequest, messages_continuation.resume),
    "responses": (ResponseCreateRequest, responses_continuation.resume),
}


def resume_of(api: str, payload: dict, model: ModelInfo) -> Continue:
    """How a stream of `api` with this payload goes on, as the API's call says: the client
    set the payload's fields of the API's request (those the ingress adds aside)."""
    if api not in RESUMES:
        body = EmbeddingRequest(model="T", input="x")
        return EmbeddingsCall(body).resume(payload, model)
    request, resume = RESUMES[api]
    client_fields = {k: v for k, v in payload.items() if k in request.model_fields}
    return resume(request.model_construct(**client_fields), payload, model)


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


async def relay(
    replicas: Replicas, payload: dict, attempts: int = 2, api: str = "chat"
) -> tuple[list, Meter]:
    endpoint = ModelEndpoint("T", replicas)
    counted = meter()
    tries = Attempts(attempts)
    first, parts = await migration.open_stream(endpoint, api, payload, counted, tries)
    stream = ContinuedStream(
        endpoint, api, first, parts, counted, tries, resume_of(api, payload, MODEL)
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
              for e in sse_events(p.data) if e != b"[DONE]"]  # fmt: skip
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
    assert "not streamed" in resume_of("embeddings", CHAT, MODEL)([], 0)


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


def anthropic(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def text_delta(text: str) -> dict:
    return {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }


MESSAGES = {"model": "T", "max_tokens": 10, "stream": True, "temperature": 0.5,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip


def message_start(message_id: str, input_tokens: int) -> dict:
    return {"type": "message_start", "message": {"id": message_id, "type": "message",
            "role": "assistant", "content": [], "model": "T", "stop_reason": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}}}  # fmt: skip


async def test_a_messages_stream_goes_on_as_one_message_from_a_prefill():
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    first = [
        ReplyPart(anthropic(message_start("msg_1", 7)) + anthropic(block), 7, 0),
        ReplyPart(anthropic(text_delta("Hello")) + anthropic(text_delta(" wor")), 7, 2),
    ]
    done = {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
            "usage": {"input_tokens": 11, "output_tokens": 8}}  # fmt: skip
    second = [
        ReplyPart(anthropic(message_start("msg_2", 11)) + anthropic(block), 11, 0),
        ReplyPart(anthropic({"type": "ping"}) + anthropic(text_delta("ld!")), 11, 1),
        ReplyPart(
            anthropic({"type": "content_block_stop", "index": 0})
            + anthropic(done)
            + anthropic({"type": "message_stop"}),
            11,
            8,
            last=True,
        ),
    ]
    replicas = Replicas([(first, failing("r1")), (second, None)])
    received, counted = await relay(replicas, MESSAGES, api="messages")
    events = [orjson.loads(e) for p in received for e in sse_events(p.data)]
    assert [e["type"] for e in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "ping", "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert events[0]["message"]["id"] == "msg_1"
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == (
        "Hello world!"
    )
    assert events[-2]["usage"] == {"input_tokens": 7, "output_tokens": 10}
    assert b"event: message_delta\ndata: " in b"".join(p.data for p in received)
    assert (counted.prompt_tokens, counted.completion_tokens) == (7, 10)
    body, avoid = replicas.calls[1]
    assert avoid == ("r1",) and body["max_tokens"] == 8 and body["temperature"] == 0.5
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello wor"}


def test_a_messages_prefill_of_the_client_is_continued_and_tools_are_not():
    payload = {
        **MESSAGES,
        "messages": [*MESSAGES["messages"], {"role": "assistant", "content": "A:"}],
    }
    sent = [anthropic(message_start("m", 3)), anthropic(text_delta(" yes"))]
    continuation = resume_of("messages", payload, MODEL)(sent, 1)
    assert continuation.payload["messages"][-1] == {"role": "assistant", "content": "A: yes"}
    assert len(continuation.payload["messages"]) == 2
    tools = {**MESSAGES, "tools": [{"name": "f", "input_schema": {}}]}
    assert "tools" in resume_of("messages", tools, MODEL)(sent, 1)
    use = {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use"}}
    assert "more than" in resume_of("messages", MESSAGES, MODEL)([anthropic(use)], 1)


def responses_event(kind: str, sequence: int, **fields) -> dict:
    return {"type": kind, "sequence_number": sequence, **fields}


def response_object(response_id: str, created: int, output: list, usage: dict | None) -> dict:
    return {"id": response_id, "object": "response", "created_at": created, "status": "completed",
            "output": output, "usage": usage}  # fmt: skip


def message_item(item_id: str, text: str | None) -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress",
            "content": content}  # fmt: skip


def responses_opening(response_id: str, created: int, item_id: str) -> bytes:
    part = {"type": "output_text", "text": "", "annotations": []}
    return b"".join(
        anthropic(e)
        for e in (
            responses_event("response.created", 0,
                            response=response_object(response_id, created, [], None)),
            responses_event("response.in_progress", 1,
                            response=response_object(response_id, created, [], None)),
            responses_event("response.output_item.added", 2, output_index=0,
                            item=message_item(item_id, None)),
            responses_event("response.content_part.added", 3, item_id=item_id, output_index=0,
                            content_index=0, part=part),
        )
    )  # fmt: skip


def output_delta(item_id: str, sequence: int, text: str) -> bytes:
    return anthropic(responses_event("response.output_text.delta", sequence, item_id=item_id,
                                     output_index=0, content_index=0, delta=text, logprobs=[]))  # fmt: skip


async def test_a_responses_stream_goes_on_as_one_response():
    payload = {"model": "T", "input": [{"role": "user", "content": "hi"}],
               "max_output_tokens": 10, "stream": True, "request_id": "resp_1"}  # fmt: skip
    first = [
        ReplyPart(responses_opening("resp_1", 100, "msg_1"), 0, 0),  # before its prefill
        ReplyPart(output_delta("msg_1", 4, "Hello") + output_delta("msg_1", 5, " wor"), 7, 2),
    ]
    done_part = {"type": "output_text", "text": "ld!", "annotations": []}
    final = responses_event(
        "response.completed", 9,
        response=response_object("resp_1", 200, [{**message_item("msg_2", "ld!"), "status": "completed"}],
                                 {"input_tokens": 11, "output_tokens": 8, "total_tokens": 19,
                                  "input_tokens_details": {"cached_tokens": 9}}),
    )  # fmt: skip
    second = [
        ReplyPart(responses_opening("resp_1", 200, "msg_2"), 11, 0),
        ReplyPart(
            output_delta("msg_2", 4, "ld!")
            + anthropic(
                responses_event(
                    "response.output_text.done",
                    5,
                    item_id="msg_2",
                    output_index=0,
                    content_index=0,
                    text="ld!",
                )
            )
            + anthropic(
                responses_event(
                    "response.content_part.done",
                    6,
                    item_id="msg_2",
                    output_index=0,
                    content_index=0,
                    part=done_part,
                )
            )
            + anthropic(
                responses_event(
                    "response.output_item.done",
                    7,
                    output_index=0,
                    item=message_item("msg_2", "ld!"),
                )
            ),
            11,
            8,
            last=True,
            final=orjson.dumps(final),
        ),  # fmt: skip
    ]
    replicas = Replicas([(first, failing("r1")), (second, None)])
    received, counted = await relay(replicas, payload, api="responses")
    events = [orjson.loads(e) for p in received for e in sse_events(p.data)]
    events.append(orjson.loads(received[-1].final))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(11))
    assert {e["item_id"] for e in events if "item_id" in e} == {"msg_1"}
    assert events[7]["text"] == events[8]["part"]["text"] == "Hello world!"
    assert events[9]["item"]["id"] == "msg_1" and events[9]["item"]["content"][0]["text"] == (
        "Hello world!"
    )
    response = events[-1]["response"]
    assert (response["id"], response["created_at"]) == ("resp_1", 100)
    assert response["output"][0]["id"] == "msg_1"
    assert response["output"][0]["content"][0]["text"] == "Hello world!"
    assert response["usage"] == {"input_tokens": 7, "output_tokens": 10, "total_tokens": 17,
                                 "input_tokens_details": {"cached_tokens": 7}}  # fmt: skip
    assert (counted.prompt_tokens, counted.completion_tokens) == (7, 10)
    body, _ = replicas.calls[1]
    assert body["max_output_tokens"] == 8 and body["request_id"] == "resp_1"
    assert body["input"][-1] == {
        "type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress",
        "content": [{"type": "output_text", "text": "Hello wor", "annotations": []}],
    }  # fmt: skip


def test_a_responses_stream_with_more_than_text_is_not_continued():
    payload = {"model": "T", "input": "hi", "stream": True}
    assert "tools" in resume_of("responses", {**payload, "tools": [{"type": "function"}]}, MODEL)(
        [], 0
    )
    schema = {"text": {"format": {"type": "json_schema", "schema": {}}}}
    assert "structured" in resume_of("responses", {**payload, **schema}, MODEL)([], 0)
    call = responses_event("response.output_item.added", 2, output_index=0,
                           item={"id": "fc_1", "type": "function_call"})  # fmt: skip
    sent = [responses_opening("r", 1, "m").split(b"\n\n")[0] + b"\n\n", anthropic(call)]
    assert "more than one message" in resume_of("responses", payload, MODEL)(sent, 1)
