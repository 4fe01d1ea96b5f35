"""Anthropic's Messages API as a backend of vLLM's load generator (`vllm bench serve --backend
anthropic-messages --endpoint /v1/messages`), which has none of its own.

The same prompts as its `openai-chat` backend, streamed; the first `text_delta` sets TTFT and
each later one an inter-token latency, as content chunks do for chat; `message_delta`'s usage
gives the output tokens. The key goes as `x-api-key`, Anthropic's header.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

BACKEND = "anthropic-messages"


async def request_messages(
    request_func_input: Any, session: Any, pbar: Any = None, mm_position: str = "last"
) -> Any:
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncOutput,
        StreamedResponseHandler,
        _get_chat_messages,
        _update_headers_common,
        _update_payload_common,
    )

    payload: dict[str, Any] = {
        "model": request_func_input.model_name or request_func_input.model,
        "messages": _get_chat_messages(request_func_input, mm_position=mm_position),
        "max_tokens": request_func_input.output_len,
        "stream": True,
    }
    _update_payload_common(payload, request_func_input)
    headers = {
        "Content-Type": "application/json",
        "x-api-key": os.environ.get("OPENAI_API_KEY", ""),
        "anthropic-version": "2023-06-01",
    }
    _update_headers_common(headers, request_func_input)

    output = RequestFuncOutput()
    output.prompt_len = request_func_input.prompt_len
    text, first = "", True
    start = latest = output.start_time = time.perf_counter()
    try:
        async with session.post(
            url=request_func_input.api_url, json=payload, headers=headers
        ) as response:
            if response.status != 200:
                output.error = f"{response.status} {await response.text()}"[:500]
            else:
                handler = StreamedResponseHandler()
                async for chunk in response.content.iter_any():
                    for message in handler.add_chunk(chunk):
                        data = _data(message)
                        if data is None:
                            continue
                        now = time.perf_counter()
                        delta = data.get("delta") or {}
                        if data["type"] == "content_block_delta" and delta.get("text"):
                            if first:
                                output.ttft, first = now - start, False
                            else:
                                output.itl.append(now - latest)
                            text += delta["text"]
                            latest = now
                        elif data["type"] == "message_start":
                            usage = data["message"].get("usage") or {}
                            output.prompt_len = usage.get("input_tokens", output.prompt_len)
                        elif data["type"] == "message_delta":
                            output.output_tokens = (data.get("usage") or {}).get("output_tokens")
                output.generated_text = text
                output.success = not first
                output.error = "" if not first else "no text_delta came"
                output.latency = latest - start
    except Exception:
        output.success = False
        output.error = "".join(traceback.format_exception(*sys.exc_info()))
    if pbar:
        pbar.update(1)
    return output


def _data(message: str) -> dict[str, Any] | None:
    """The JSON of an SSE event's `data:` line; None for a ping or anything without one."""
    for line in message.splitlines():
        if line.startswith("data: "):
            data = json.loads(line.removeprefix("data: "))
            return None if data.get("type") == "ping" else data
    return None


def register() -> None:
    """Add the backend to vLLM's table before its CLI builds the `--backend` choices."""
    from vllm.benchmarks.lib import endpoint_request_func

    endpoint_request_func.ASYNC_REQUEST_FUNCS[BACKEND] = request_messages
