"""POST /v1/completions: the legacy prompt completion, with the same keys, plans and usage."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from app.accounts.auth import Caller, authenticate
from app.apis.chat.route import ERRORS
from app.apis.completions.call import CompletionCall
from app.apis.completions.protocol import CompletionRequest
from app.serving.pipeline import serve

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
    return await serve(request, caller, CompletionCall(body))
