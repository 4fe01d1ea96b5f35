"""/v1/responses as an `ApiCall` of the pipeline: the conversation and the store.

The gateway keeps stored responses in its database, never in a replica: `previous_response_id`
is resolved here into the input items of the earlier turns, the model replica (vLLM's own
Responses handler, which stores nothing) gets the whole conversation, and a finished response
is stored before the client gets its last event, so that any ingress replica can continue the
conversation at once.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from app.accounts.auth import Caller
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.responses import ResponseStore
from app.openai.errors import ApiError
from app.openai.protocol import ReplyLength
from app.openai.responses import ResponseCreateRequest, new_response_id
from app.serving.pipeline import check_reasoning, check_tools
from deployments.wire import ModelInfo, ReplyPart

logger = logging.getLogger("ray.serve.serviceai")


class ResponsesCall:
    keepalive = None  # OpenAI's streams send no keep-alive event
    api = "responses"

    def __init__(self, body: ResponseCreateRequest, caller: Caller, store: ResponseStore) -> None:
        self.body = body
        self.model = body.model
        self.stream = body.stream
        self.reply = ReplyLength("max_output_tokens", body.max_output_tokens)
        self.prompt_bytes = 0
        self._caller = caller
        self._store = store
        self._new_items: list[dict[str, Any]] = []
        self._conversation: list[dict[str, Any]] = []
        self._response_id = new_response_id()

    def check_fields(self) -> None:
        """Fields, tools and input items it cannot honour: a 400 naming them."""
        self.body.check()
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
            history = previous.conversation()
            self.prompt_bytes = len(orjson.dumps(history))
            conversation = [*history, *conversation]
        if self.body.store:
            self._store.check_size(conversation)
        self._conversation = conversation

    def payload(self) -> dict:
        return self.body.payload(self._response_id, self._conversation)

    async def whole(self, data: bytes) -> bytes:
        response = orjson.loads(data)
        await self._keep(response)
        return orjson.dumps(response)

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

    def error_event(self, error: ApiError) -> bytes:
        return b"event: error\ndata: %s\n\n" % orjson.dumps({"type": "error", **error.body()})

    async def _keep(self, response: dict[str, Any]) -> None:
        """Store a finished response; one that cannot be stored says so (store: false)."""
        if not self.body.store:
            return
        try:
            await self._store.save(self._caller.user_id, self._conversation, response)
        except KeyStoreError as exc:
            logger.warning("Response %s not stored: %s", self._response_id, exc.code)
            response["store"] = False
