"""/v1/responses as an `ApiCall` of the pipeline: the conversation and the store.

The gateway keeps stored responses in its database, never in a replica: `previous_response_id`
is resolved here into the input items of the earlier turns, the model replica (vLLM's own
Responses handler, which stores nothing) gets the whole conversation, and a finished response
is stored before the client gets its last event, so that any ingress replica can continue the
conversation at once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from fastapi import Response

from app.accounts.auth import Caller
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.responses import UNFINISHED, ResponseStore
from app.apis.responses import background, continuation
from app.apis.responses.protocol import ResponseCreateRequest, new_response_id
from app.limits.structure_bounds import check_structures, marked
from app.limits.ticket import Ticket
from app.openai.errors import ApiError
from app.openai.protocol import ReplyLength
from app.serving.checks import InputSize, check_reasoning, check_tools
from app.serving.continuation import Continue
from app.serving.migration import Failover
from deployments.wire import Api, ModelInfo, ReplyPart

logger = logging.getLogger("ray.serve.serviceai")


class ResponsesCall:
    keepalive: bytes | None = None  # OpenAI's streams send no keep-alive event
    inputs: InputSize | None = None
    api = Api.RESPONSES

    def __init__(self, body: ResponseCreateRequest, caller: Caller, store: ResponseStore) -> None:
        self.body = body
        self.model = body.model
        self.stream = body.stream
        self.background = body.background
        self.reply = ReplyLength("max_output_tokens", body.max_output_tokens)
        self.prompt_bytes = 0
        self._caller = caller
        self._store = store
        self._new_items: list[dict[str, Any]] = []
        self._conversation: list[dict[str, Any]] = []
        self._queued: dict[str, Any] = {}
        self.response_id = new_response_id()

    def check_fields(self) -> None:
        """Fields, tools and input items it cannot honour: a 400 naming them."""
        self.body.check()
        check_structures(self.body.structures())
        self._new_items = self.body.new_items()

    def check_against_model(self, model: ModelInfo) -> None:
        check_tools(model, self.body.tools, self.body.tool_choice)
        reasoning = self.body.reasoning
        check_reasoning(model, reasoning is not None and reasoning.asked, "reasoning")

    async def prepare(self) -> None:
        """The conversation: the earlier turns' input and output items, then this turn's."""
        conversation = self._new_items
        previous_id = self.body.previous_response_id
        if previous_id is not None:
            previous = await self._store.get(
                self._caller.user_id, previous_id, param="previous_response_id"
            )
            if previous.status in UNFINISHED:
                raise ApiError(
                    400,
                    f"Response '{previous_id}' is still {previous.status}: a conversation "
                    "continues from a finished response.",
                    param="previous_response_id",
                    code="invalid_value",
                )
            history = previous.conversation()
            self.prompt_bytes = len(orjson.dumps(history))
            conversation = [*history, *conversation]
        if self.body.store:
            self._store.check_size(conversation)
            await self._store.check_room(self._caller.user_id)
        self._conversation = conversation

    def payload(self) -> dict:
        return marked(
            self.body.payload(self.response_id, self._conversation), self.body.structures()
        )

    async def whole(self, data: bytes) -> bytes:
        response = orjson.loads(data)
        await self._keep(response)
        return orjson.dumps(response)

    async def in_background(self, failover: Failover, ticket: Ticket) -> Response:
        """The response stored queued and answered now; generated after, its end stored."""
        queued = await self.queued(failover.endpoint.name)
        background.start(background.generate(self, failover, ticket))
        return Response(queued, media_type="application/json", headers=ticket.headers)

    async def queued(self, model: str) -> bytes:
        """A background response as it starts: stored queued, as the client gets it now."""
        self._queued = {
            "id": self.response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "queued",
            "background": True,
            "model": model,
            "output": [],
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **self.body.model_dump(
                include={
                    "instructions",
                    "max_output_tokens",
                    "metadata",
                    "parallel_tool_calls",
                    "previous_response_id",
                    "reasoning",
                    "store",
                    "temperature",
                    "text",
                    "tool_choice",
                    "tools",
                    "top_p",
                    "user",
                },
                by_alias=True,
            ),
        }
        await self._store.save(self._caller.user_id, self._conversation, self._queued)
        return orjson.dumps(self._queued)

    async def started(self) -> None:
        await self._store.start(self._caller.user_id, self.response_id)

    async def cancelled(self) -> bool:
        status = await self._store.status(self._caller.user_id, self.response_id)
        return status not in UNFINISHED

    async def failed(self, error: ApiError) -> None:
        """A background response that could not be generated: stored failed, with the error
        a request would have got (its code and message)."""
        failed = {
            **self._queued,
            "status": "failed",
            "error": {"code": error.code or "server_error", "message": error.message},
        }
        try:
            await self._store.finish(self._caller.user_id, failed, self._input_bytes())
        except KeyStoreError as exc:
            logger.warning("Response %s not stored: %s", self.response_id, exc.code)

    async def events(self, part: ReplyPart) -> bytes:
        """The replica's events as they are; the terminal one once the response is stored."""
        if part.final is None:
            return part.data
        event = orjson.loads(part.final)
        await self._keep(event["response"])
        return part.data + b"event: %s\ndata: %s\n\n" % (
            event["type"].encode(),
            orjson.dumps(event),
        )

    def resume(self, payload: dict, model: ModelInfo) -> Continue:
        return continuation.resume(self.body, payload, model)

    def error_event(self, error: ApiError) -> bytes:
        return b"event: error\ndata: %s\n\n" % orjson.dumps({"type": "error", **error.body()})

    async def _keep(self, response: dict[str, Any]) -> None:
        """Store a finished response; one that cannot be stored says so (store: false)."""
        if not self.body.store:
            return
        try:
            if self.background:
                response["background"] = True
                await self._store.finish(self._caller.user_id, response, self._input_bytes())
            else:
                await self._store.save(self._caller.user_id, self._conversation, response)
        except KeyStoreError as exc:
            logger.warning("Response %s not stored: %s", self.response_id, exc.code)
            response["store"] = False
            if self.background:  # its client reads it from the store only
                await self.failed(ApiError(exc.status, exc.message, code=exc.code))

    def _input_bytes(self) -> int:
        return len(orjson.dumps(self._conversation))
