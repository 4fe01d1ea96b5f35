"""Ray Serve's own response objects around calls that no replica runs, for the ingress's tests.

The ingress tracks a call until Serve gives it a replica (app.serving.dispatch): fakes of a handle
return these, so that what the ingress awaits and cancels is Serve's code, not a stand-in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace

from ray.serve._private.common import RequestMetadata
from ray.serve.handle import DeploymentResponse, DeploymentResponseGenerator


def assigned() -> concurrent.futures.Future:
    """The assignment of a call that a replica took at once."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(None)
    return future


def serve_response(kind=DeploymentResponse, answer: object = None, assigned: bool = True):
    """A real Serve response of a call; once assigned, its replica answers `answer` (raised if
    an exception); unassigned, it waits for Serve to find a replica, as while none is left."""
    future = asyncio.get_running_loop().create_future()
    if assigned:

        async def get_async():
            if isinstance(answer, Exception):
                raise answer
            return answer

        future.set_result(SimpleNamespace(get_async=get_async, cancel=lambda: None))
    metadata = RequestMetadata(request_id="r", internal_request_id="r")
    return kind(future, metadata, _is_router_running_in_separate_loop=False)


def serve_stream(parts: list, then: BaseException | None = None) -> DeploymentResponseGenerator:
    """A real Serve response of a streamed call that a replica took: `parts`, then `then`
    raised, or (None) a replica still at work: the next part never comes."""
    items = iter(parts)

    async def next_part():
        for part in items:
            return part
        if then is not None:
            raise then
        await asyncio.Event().wait()

    future = asyncio.get_running_loop().create_future()
    future.set_result(SimpleNamespace(__anext__=next_part, cancel=lambda: None))
    metadata = RequestMetadata(request_id="r", internal_request_id="r", is_streaming=True)
    return DeploymentResponseGenerator(future, metadata, _is_router_running_in_separate_loop=False)


class FakeHandle:
    """A model type's handle that no replica serves; tests give it the calls they need."""

    def __init__(self, name: str, app: str = "serviceai") -> None:
        self.deployment_name = name
        self.app_name = app

    def options(self, **kwargs):
        return self
