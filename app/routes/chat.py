"""POST /v1/chat/completions: whole replies and server-sent-event streams."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from ray.serve.handle import DeploymentResponseGenerator
from sse_starlette import EventSourceResponse

from app.auth import Caller, authenticate
from app.dispatch import ModelEndpoint, ModelRouter
from app.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ErrorResponse,
    Usage,
)
from app.sse import DONE, ChunkEncoder, error_event
from app.streaming import coalesced
from deployments.generation import GenerationChunk

router = APIRouter()

SSE_PING_S = 15

_ERRORS = {
    status: {"model": ErrorResponse}
    for status in (400, 401, 404, 429, 500, 503)
}


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={
        **_ERRORS,
        200: {
            "description": "A chat completion, or with `stream: true` a `text/event-stream` "
            "of `data: {ChatCompletionChunk}` events ending with `data: [DONE]`.",
            "content": {"text/event-stream": {"schema": ChatCompletionChunk.model_json_schema()}},
        },
    },
)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, caller: Caller = Depends(authenticate)
):
    models: ModelRouter = request.app.state.models
    endpoint = models.resolve(body.model)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    generation = body.to_generation(completion_id)
    created = int(time.time())

    if body.stream:
        first, stream = await endpoint.open_stream(generation)
        encoder = ChunkEncoder(completion_id, created, endpoint.name, body.include_usage)
        return EventSourceResponse(
            _events(encoder, endpoint, first, stream, body.n or 1, body.include_usage),
            sep="\n",
            ping=SSE_PING_S,
        )

    result = await endpoint.complete(generation)
    return ChatCompletion(
        id=completion_id,
        created=created,
        model=endpoint.name,
        choices=[
            Choice(
                index=d.index,
                message=AssistantMessage(content=d.text),
                finish_reason=d.finish_reason or "stop",
            )
            for d in result.deltas
        ],
        usage=_usage(result.prompt_tokens, sum(d.token_count for d in result.deltas)),
    )


async def _events(
    encoder: ChunkEncoder,
    endpoint: ModelEndpoint,
    first: GenerationChunk,
    stream: DeploymentResponseGenerator,
    choices: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    completion_tokens = 0
    finished = False
    try:
        for index in range(choices):
            yield encoder.role(index)
        async for deltas in coalesced(first, stream):
            for delta in deltas:
                completion_tokens += delta.token_count
                if delta.text or delta.finish_reason:
                    yield encoder.content(delta.index, delta.text, delta.finish_reason)
        if include_usage:
            yield encoder.usage(first.prompt_tokens, completion_tokens)
        finished = True
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        finished = True
        yield error_event(endpoint.error(exc).body())
    finally:
        if not finished:
            # The client went away: free the engine at once rather than generate for nobody.
            stream.cancel()
    yield DONE


def _usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )
