"""/v1/responses: OpenAI's Responses API, whole and streamed, and the caller's stored responses.

A new response goes through the pipeline as chat does (app.apis.responses.call holds what
differs: the stored conversation); the stored ones are read, paged and deleted here.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from app.accounts.auth import Caller, authenticate
from app.accounts.keystore.responses import MAX_PAGE
from app.apis.responses.call import ResponsesCall
from app.apis.responses.protocol import ResponseCreateRequest
from app.openai.errors import ApiError
from app.openai.protocol import ErrorResponse
from app.serving.pipeline import serve

router = APIRouter(
    tags=["responses"],
    responses={status: {"model": ErrorResponse} for status in (400, 401, 404, 429, 500, 503)},
)


@router.post(
    "/v1/responses",
    responses={
        200: {
            "description": "A response object, or with `stream: true` a `text/event-stream` of "
            "OpenAI's response events, each with its `sequence_number`.",
            "content": {"application/json": {}, "text/event-stream": {}},
        }
    },
)
async def create_response(
    body: ResponseCreateRequest, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    return await serve(request, caller, ResponsesCall(body, caller, request.app.state.responses))


@router.get("/v1/responses/{response_id}")
async def get_response(
    response_id: str, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    """A stored response of the caller, as it was returned; a background one as it stands
    (queued, in_progress, then as it ended)."""
    _refuse_query(request, "stream", "starting_after", "include")
    stored = await request.app.state.responses.get(caller.user_id, response_id)
    return Response(orjson.dumps(stored.body), media_type="application/json")


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(
    response_id: str, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    """Cancel a background response that has not ended (its generation stops within a
    second); the response as it now is. One that has ended is returned as it is."""
    stored = await request.app.state.responses.cancel(caller.user_id, response_id)
    return Response(orjson.dumps(stored.body), media_type="application/json")


@router.delete("/v1/responses/{response_id}")
async def delete_response(
    response_id: str, request: Request, caller: Caller = Depends(authenticate)
) -> dict[str, Any]:
    await request.app.state.responses.delete(caller.user_id, response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    request: Request,
    caller: Caller = Depends(authenticate),
    limit: int = Query(20, ge=1, le=MAX_PAGE),
    order: Literal["asc", "desc"] = Query("desc"),
    after: str | None = Query(None, description="The id of the last item of the previous page."),
) -> dict[str, Any]:
    """The input the model saw for this response (replayed history included), newest first
    unless `order=asc`, in pages of `limit`."""
    _refuse_query(request, "include", "before")
    page = await request.app.state.responses.input_items(
        caller.user_id, response_id, limit=limit, order=order, after=after
    )
    return page.as_list()


def _refuse_query(request: Request, *names: str) -> None:
    for name in names:
        if name in request.query_params:
            raise ApiError(
                400,
                f"ServiceAi does not support '{name}' on {request.url.path}.",
                param=name,
                code="unsupported_parameter",
            )
