"""/v1/responses: OpenAI's Responses API, whole and streamed, with responses stored per user.

The ingress resolves `previous_response_id` from the database into input items, admits the
request as chat does (plan limits up front, the engine's real counts after: the replayed
history is input), sends the whole conversation to the model replica (vLLM's own Responses
handler, which stores nothing), and stores the finished response before the client gets its
last event, so that any ingress replica can continue the conversation at once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from ray.serve.handle import DeploymentResponseGenerator

from app.auth import Caller, authenticate
from app.dispatch import ModelEndpoint, ModelRouter
from app.errors import ApiError, error_body
from app.keystore.errors import KeyStoreError
from app.keystore.responses import MAX_PAGE, ResponseStore
from app.observability.request_record import RequestRecord, record_of
from app.protocol import ErrorResponse
from app.ratelimit import RateLimits
from app.relay import Tally, charged_on_failure, event_stream
from app.responses_protocol import ResponseCreateRequest, new_response_id
from deployments.responses_wire import ResponsePart

logger = logging.getLogger("ray.serve.serviceai")

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
    body.check()
    conversation = body.new_items()
    models: ModelRouter = request.app.state.models
    store: ResponseStore = request.app.state.responses
    endpoint = models.resolve(body.model)
    record = record_of(request)
    record.model_type = endpoint.name
    if body.previous_response_id is not None:
        previous = await store.get(
            caller.user_id, body.previous_response_id, param="previous_response_id"
        )
        conversation = [*previous.conversation(), *conversation]
    if body.store:
        store.check_size(conversation)
    limits: RateLimits = request.app.state.limits
    model = await endpoint.info()
    admission = await limits.admit(caller, endpoint.name, body.max_output_tokens)
    response_id = new_response_id()
    echo = {"store": body.store, "previous_response_id": body.previous_response_id}
    record.sent_to(endpoint.name, body.stream)

    def done(prompt_tokens: int, completion_tokens: int) -> None:
        """The engine's real usage (history included), charged and metered for the key."""
        admission.settle(prompt_tokens, completion_tokens)
        request.app.state.usage.record(
            caller.key_id, endpoint.name, prompt_tokens, completion_tokens
        )

    async def keep(response: dict[str, Any]) -> None:
        """Store a finished response; one that cannot be stored says so (store: false)."""
        if not body.store:
            return
        try:
            await store.save(caller.user_id, conversation, response)
        except KeyStoreError as exc:
            logger.warning("Response %s not stored: %s", response_id, exc.code)
            response["store"] = False

    replica_body = body.replica_body(response_id, conversation)
    longest = admission.reply_length(model.max_model_len)
    if body.max_output_tokens is None and longest is not None:
        replica_body["max_output_tokens"] = longest  # no reply runs past what the plan has left
    stream = endpoint.open_responses(replica_body, echo)
    with charged_on_failure(admission, done):
        if body.stream:
            first: ResponsePart = await endpoint.first_part(stream)
        else:  # parts with the counts so far, then the response
            first = await endpoint.whole_part(stream, lambda part: part.final is not None)

    if body.stream:
        record.first_token(first.prompt_tokens)
        tally = Tally(first)
        events = _relay(stream, endpoint, keep, tally, record)
        return event_stream(events, tally, stream, admission, done)

    done(first.prompt_tokens, first.completion_tokens)
    record.completed(first.prompt_tokens, first.completion_tokens)
    reply = orjson.loads(first.final)
    await keep(reply)
    return Response(orjson.dumps(reply), media_type="application/json", headers=admission.headers)


@router.get("/v1/responses/{response_id}")
async def get_response(
    response_id: str, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    """A stored response of the caller, as it was returned."""
    _refuse_query(request, "stream", "starting_after", "include")
    stored = await request.app.state.responses.get(caller.user_id, response_id)
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


async def _relay(
    stream: DeploymentResponseGenerator,
    endpoint: ModelEndpoint,
    keep: Callable[[dict[str, Any]], Any],
    tally: Tally,
    record: RequestRecord,
) -> AsyncIterator[bytes]:
    """The replica's events as they are; the terminal one after the response is stored."""
    part: ResponsePart = tally.last
    try:
        while True:
            if part.events:
                yield part.events
            if part.final is not None:
                event = orjson.loads(part.final)
                await keep(event["response"])
                # Complete before the last event is written: the client may hang up on it.
                tally.finish(record, 200)
                yield b"event: %s\ndata: %s\n\n" % (event["type"].encode(), orjson.dumps(event))
                return
            try:
                part = tally.last = await anext(stream)
            except StopAsyncIteration:
                raise EOFError("the stream ended without its last event") from None
    except Exception as exc:
        error = endpoint.error(exc)
        tally.finish(record, error.status)
        payload = {"type": "error", **error_body(error.message, error.type, error.param, error.code)}
        yield b"event: error\ndata: %s\n\n" % orjson.dumps(payload)
