"""Each API says, in its own folder, what each of its fields does to a stream that goes on on
another replica (app/apis/<api>/continuation.py): every field of its request is classified
once, and a field it has not classified (one added since) makes a reply not continuable."""

from __future__ import annotations

import pytest

from app.apis.chat import continuation as chat
from app.apis.chat.protocol import ChatCompletionRequest
from app.apis.completions import continuation as completions
from app.apis.completions.protocol import CompletionRequest
from app.apis.messages import continuation as messages
from app.apis.messages.protocol import MessagesRequest
from app.apis.responses import continuation as responses
from app.apis.responses.protocol import ResponseCreateRequest
from app.serving.continuation import unclassified
from deployments.wire import ModelInfo

APIS = [
    (chat, ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]}),
    (completions, CompletionRequest, {"prompt": "Once"}),
    (messages, MessagesRequest, {"messages": [{"role": "user", "content": "hi"}]}),
    (responses, ResponseCreateRequest, {"input": "hi"}),
]


@pytest.mark.parametrize(("rules", "request_model", "body"), APIS)
def test_every_field_of_the_request_is_classified_once(rules, request_model, body):
    assert not rules.CONTINUABLE & rules.CHECKED
    assert rules.CONTINUABLE | rules.CHECKED == set(request_model.model_fields), (
        "classify the new field in its API's continuation.py"
    )


@pytest.mark.parametrize(("rules", "request_model", "body"), APIS)
def test_a_field_the_api_has_not_classified_is_not_continued(rules, request_model, body):
    payload = {"model": "T", "stream": True, **body}
    request = request_model.model_construct(**payload)
    assert unclassified(request.model_fields_set, rules.CONTINUABLE | rules.CHECKED) is None

    request.model_fields_set.add("novel_field")
    said = rules.resume(request, payload, ModelInfo("T", 2048))([], 0)
    assert said == "novel_field, a field whose continuation is unknown"
