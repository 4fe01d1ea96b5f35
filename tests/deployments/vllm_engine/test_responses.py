"""vLLM's Responses handler stores nothing: the gateway's `store` and `previous_response_id`
are taken out of the body vLLM gets, and echoed in every response object it makes."""

from __future__ import annotations

import json

from deployments.vllm_engine.responses import ResponsesApi


class ResponseObject:
    """Stands for vLLM's ResponsesResponse: what it holds is what it encodes."""

    def __init__(self, **fields) -> None:
        vars(self).update(fields)

    def model_dump_json(self, **_) -> str:
        return json.dumps(vars(self))


class StreamEvent:
    def __init__(self, type: str, response: ResponseObject | None = None) -> None:
        self.type, self.response = type, response

    def model_dump_json(self, **_) -> str:
        fields = {"type": self.type}
        if self.response is not None:
            fields["response"] = vars(self.response)
        return json.dumps(fields)


def test_vllm_gets_store_off_and_no_previous_id_and_the_reply_says_what_the_gateway_does():
    body = {"model": "m", "input": [], "store": True, "previous_response_id": "resp_1"}
    api = ResponsesApi(serving=None, body=body)
    assert body == {"model": "m", "input": [], "store": False}
    reply = json.loads(api.body(ResponseObject(id="resp_2", store=False), None))
    assert reply == {"id": "resp_2", "store": True, "previous_response_id": "resp_1"}


async def test_a_streams_terminal_event_is_held_apart_for_the_gateway_to_store_first():
    api = ResponsesApi(serving=None, body={"store": True, "previous_response_id": None})

    async def stream():
        yield StreamEvent("response.created", ResponseObject(store=False))
        yield StreamEvent("response.output_text.delta")
        yield StreamEvent("response.completed", ResponseObject(store=False))

    events = [event async for event in api.events(stream(), None)]
    assert [e.last for e in events] == [False, False, True]
    assert events[0].data.startswith(b"event: response.created\ndata: ")
    assert b'"store": true' in events[0].data
    assert events[-1].data == b"" and json.loads(events[-1].final)["response"]["store"] is True
