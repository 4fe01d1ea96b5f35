"""POST /v1/chat/completions: whole replies and server-sent-event streams."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Depends, Request, Response
from ray.serve.handle import DeploymentResponseGenerator
from sse_starlette import EventSourceResponse

from app.auth import Caller, authenticate
from app.dispatch import ModelEndpoint, ModelRouter
from app.errors import ApiError
from app.observability.request_record import RequestRecord, record_of
from app.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ErrorResponse,
    Usage,
)
from app.ratelimit import RateLimits
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
    body: ChatCompletionRequest,
    request: Request,
    response: Response,
    caller: Caller = Depends(authenticate),
):
    models: ModelRouter = request.app.state.models
    endpoint = models.resolve(body.model)
    record = record_of(request)
    record.model_type = endpoint.name  # a 429 below is counted against the type it asked for
    limits: RateLimits = request.app.state.limits
    reply_tokens = None if body.reply_limit is None else body.reply_limit * (body.n or 1)
    admission = await limits.admit(caller, endpoint.name, reply_tokens)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    generation = body.to_generation(completion_id)
    created = int(time.time())
    record.sent_to(endpoint.name, body.stream)

    def done(prompt_tokens: int, completion_tokens: int) -> None:
        """The engine's real usage, charged to the rate limits and metered for the key."""
        admission.settle(prompt_tokens, completion_tokens)
        request.app.state.usage.record(
            caller.key_id, endpoint.name, prompt_tokens, completion_tokens
        )

    try:
        if body.stream:
            first, stream = await endpoint.open_stream(generation)
        else:
            result = await endpoint.complete(generation)
    except BaseException as error:
        admission.settle(0, 0)  # no reply, nothing to charge: only the concurrency slot is freed
        if isinstance(error, ApiError):
            error.headers.update(admission.headers)
        raise

    if body.stream:
        record.first_token(first.prompt_tokens)
        encoder = ChunkEncoder(completion_id, created, endpoint.name, body.include_usage)
        return EventSourceResponse(
            _events(
                encoder, endpoint, first, stream, body.n or 1, body.include_usage, done, record
            ),
            sep="\n",
            ping=SSE_PING_S,
            headers=admission.headers,
        )

    completion_tokens = sum(d.token_count for d in result.deltas)
    done(result.prompt_tokens, completion_tokens)
    record.completed(result.prompt_tokens, completion_tokens)
    response.headers.update(admission.headers)
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
        usage=_usage(result.prompt_tokens, completion_tokens),
    )


async def _events(
    encoder: ChunkEncoder,
    endpoint: ModelEndpoint,
    first: GenerationChunk,
    stream: DeploymentResponseGenerator,
    choices: int,
    include_usage: bool,
    done: Callable[[int, int], None],
    record: RequestRecord,
) -> AsyncIterator[str]:
    completion_tokens = 0
    finished = False
    error_status = None
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
        error = endpoint.error(exc)
        error_status = error.status
        yield error_event(error.body())
    finally:
        if finished:
            record.stream_ended(completion_tokens, error_status)
        else:
            # The client went away: free the engine at once rather than generate for nobody.
            stream.cancel()
        # Whatever the engine produced counts, a stream the client cut off included.
        done(first.prompt_tokens, completion_tokens)
    yield DONE


def _usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )
