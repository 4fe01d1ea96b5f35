"""POST /v1/chat/completions: whole replies and server-sent-event streams."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from app.accounts.auth import Caller, authenticate
from app.apis.chat.call import ChatCall
from app.apis.chat.protocol import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest
from app.openai.protocol import ErrorResponse
from app.serving.pipeline import serve

router = APIRouter()

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 404, 429, 500, 503)
}


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={
        **ERRORS,
        200: {
            "description": "A chat completion, or with `stream: true` a `text/event-stream` "
            "of `data: {ChatCompletionChunk}` events ending with `data: [DONE]`.",
            "content": {"text/event-stream": {"schema": ChatCompletionChunk.model_json_schema()}},
        },
    },
)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    return await serve(request, caller, ChatCall(body))
