import json

from openai.types.chat import ChatCompletionChunk as OpenAIChunk

from app.protocol import ChatCompletionChunk
from app.sse import ChunkEncoder, error_event


def decode(event: str) -> dict:
    chunk = json.loads(event)
    ChatCompletionChunk.model_validate(chunk)  # our own wire model
    OpenAIChunk.model_validate(chunk)  # what the official client parses
    return chunk


def test_chunks_share_id_created_and_model():
    encoder = ChunkEncoder("chatcmpl-abc", 1700000000, "ServiceAi-Fast", include_usage=False)
    chunks = [decode(encoder.role(0)), decode(encoder.content(0, "Hel")), decode(encoder.content(0, "lo", "stop"))]
    assert {(c["id"], c["created"], c["model"], c["object"]) for c in chunks} == {
        ("chatcmpl-abc", 1700000000, "ServiceAi-Fast", "chat.completion.chunk")
    }
    assert all("usage" not in c for c in chunks)


def test_first_chunk_carries_the_role_and_empty_content():
    chunk = decode(ChunkEncoder("id", 1, "m", False).role(0))
    assert chunk["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]


def test_content_and_finish_chunks():
    encoder = ChunkEncoder("id", 1, "m", False)
    assert decode(encoder.content(1, "é\n\"x\""))["choices"][0] == {
        "index": 1, "delta": {"content": "é\n\"x\""}, "logprobs": None, "finish_reason": None
    }
    assert decode(encoder.content(0, "", "length"))["choices"][0]["delta"] == {}
    assert decode(encoder.content(0, "", "length"))["choices"][0]["finish_reason"] == "length"


def test_include_usage_adds_null_usage_then_a_usage_chunk():
    encoder = ChunkEncoder("id", 1, "m", include_usage=True)
    assert decode(encoder.content(0, "a"))["usage"] is None
    usage = decode(encoder.usage(12, 5))
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}


def test_events_are_single_line_json():
    encoder = ChunkEncoder("id", 1, "m", False)
    assert "\n" not in encoder.content(0, "line one\nline two\r\n")
    assert json.loads(error_event({"error": {"message": "boom"}})) == {"error": {"message": "boom"}}
