"""/v1/messages: Anthropic's Messages API, whole and streamed, and its token count.

A message goes through the pipeline as chat does (app.apis.messages.call holds what
differs); every failure under this path is written in Anthropic's envelope
(app.anthropic.envelope). Keys come as `x-api-key` or `Authorization: Bearer`.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from app.accounts.auth import Caller, authenticate
from app.apis.messages.call import MessagesCall
from app.apis.messages.protocol import CountTokensRequest, MessagesRequest
from app.serving.adapters import adapter_path
from app.serving.checks import check_api_served
from app.serving.pipeline import serve, target
from deployments.wire import ADAPTER_PATH, Api

router = APIRouter(tags=["messages"])


@router.post(
    "/v1/messages",
    responses={
        200: {
            "description": "A message, or with `stream: true` a `text/event-stream` of "
            "Anthropic's message events.",
            "content": {"application/json": {}, "text/event-stream": {}},
        }
    },
)
async def create_message(
    body: MessagesRequest, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    return await serve(request, caller, MessagesCall(body))


@router.post("/v1/messages/count_tokens")
async def count_tokens(
    body: CountTokensRequest, request: Request, caller: Caller = Depends(authenticate)
) -> dict[str, int]:
    """The prompt's tokens as the model type's replica renders it; it counts as a request
    against the caller's request rate (a replica rendered it)."""
    models = request.app.state.models
    endpoint, adapter = target(models, caller, body.model)
    call = MessagesCall(body)
    call.check_fields()
    model = await endpoint.info()
    registered_path = await adapter_path(request.app.state.adapters, adapter, model)
    check_api_served(call.api, model)
    call.check_against_model(model)
    await request.app.state.limits.refuse(caller, endpoint.name)
    payload = {**call.payload(), "model": adapter or endpoint.name}
    if registered_path is not None:
        payload[ADAPTER_PATH] = registered_path
    return {"input_tokens": await endpoint.prompt_tokens(Api.MESSAGES, payload)}
