"""POST /v1/completions: the legacy prompt completion, with the same keys, plans and usage."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from app.auth import Caller, authenticate
from app.protocol import CompletionRequest
from app.relay import relay
from app.routes.chat import ERRORS

router = APIRouter()


@router.post(
    "/v1/completions",
    responses={
        **ERRORS,
        200: {
            "description": "A text completion, or with `stream: true` a `text/event-stream` "
            "of `data: {completion chunk}` events ending with `data: [DONE]`."
        },
    },
)
async def create_completion(
    body: CompletionRequest, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    reply_tokens = body.reply_limit * max(body.choices, body.best_of or 1) * body.prompts
    return await relay(request, caller, body, "completion", reply_tokens)
