import asyncio
from types import SimpleNamespace

import pytest
from ray.exceptions import RayActorError
from ray.serve._private.config import DeploymentConfig
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentResponseGenerator

from app.limits.ticket import Meter
from app.openai.errors import ApiError
from app.serving import dispatch
from app.serving.dispatch import ModelEndpoint
from app.serving.endpoints import ModelEndpoints
from deployments.ray_internals import running_replicas, scales_to_zero
from deployments.wire import EngineUnavailable, InvalidGenerationRequest, ModelInfo, ReplyPart
from tests.app.serve_fakes import FakeHandle, serve_response, serve_stream


def endpoint(name: str = "ServiceAi-Pro") -> ModelEndpoint:
    return ModelEndpoint(name, FakeHandle(name))


def too_long() -> InvalidGenerationRequest:
    """A prompt beyond the context, as the replica refuses it (replies.refusal)."""
    error = InvalidGenerationRequest("too long")
    error.code, error.param = "context_length_exceeded", "messages"
    return error


def test_generation_errors_keep_their_status_and_code():
    error = endpoint().error(too_long())
    assert (error.status, error.code, error.param, error.message) == (
        400,
        "context_length_exceeded",
        "messages",
        "too long",
    )


def test_errors_wrapped_by_ray_are_unwrapped():
    wrapped = SimpleNamespace(cause=EngineUnavailable("engine stopped"))
    error = endpoint().error(wrapped)
    assert error.status == 503 and error.headers["Retry-After"] == "5"


def test_full_queue_is_503_with_retry_after():
    error = endpoint().error(BackPressureError(num_queued_requests=10, max_queued_requests=10))
    assert error.status == 503 and error.code == "model_overloaded"
    assert error.headers == {"Retry-After": "1"}
    assert "ServiceAi-Pro" in error.message


def test_dead_replica_is_503():
    assert endpoint().error(RayActorError()).code == "model_unavailable"


def test_anything_else_is_500_without_details():
    error = endpoint().error(ValueError("internal path /x/y"))
    assert error.status == 500 and "/x/y" not in error.message


def test_router_404_lists_models_and_503_without_replicas(monkeypatch):
    counts = {"A": 1, "B": 0, "Z": 0}
    monkeypatch.setattr(
        "app.serving.dispatch.running_replicas", lambda h: counts[h.deployment_name]
    )
    router = ModelEndpoints(
        {n: FakeHandle(n) for n in ("A", "B", "Z")}, created=1, scale_to_zero=frozenset({"Z"})
    )
    with pytest.raises(ApiError) as info:
        router.resolve("C")
    assert info.value.status == 404 and info.value.message.endswith("Available models: A, B, Z.")
    assert router.resolve("A").name == "A"
    assert router.get("B").name == "B"
    with pytest.raises(ApiError) as info:
        router.resolve("B")
    assert info.value.status == 503 and info.value.headers["Retry-After"] == "5"
    assert router.resolve("Z").name == "Z"  # scales to zero: the request waits for a cold start
    counts["B"] = None  # the router has not heard from the controller yet: do not refuse
    assert router.resolve("B").name == "B"


def test_an_alias_or_a_pattern_reaches_its_type_and_anything_else_is_404(monkeypatch):
    monkeypatch.setattr("app.serving.dispatch.running_replicas", lambda h: 1)
    aliases = {"claude-*haiku*": "A", "claude-*": "B", "gpt-4o": "A"}
    router = ModelEndpoints({n: FakeHandle(n) for n in "AB"}, created=1, aliases=aliases)
    assert router.resolve("claude-3-5-haiku-20241022").name == "A"
    assert router.resolve("claude-sonnet-4-5-20250929").name == "B"  # first match in order
    assert router.get("gpt-4o").name == "A"
    with pytest.raises(ApiError) as info:
        router.get("gpt-4o-mini")
    assert info.value.status == 404 and info.value.message.endswith("Available models: A, B.")


def test_running_replicas_of_an_unused_handle_is_unknown():
    assert running_replicas(FakeHandle("A")) is None


def test_readiness_tells_a_first_replica_pending_from_replicas_lost(monkeypatch):
    counts = {"A": 0, "Z": 0}
    monkeypatch.setattr(
        "app.serving.dispatch.running_replicas", lambda h: counts[h.deployment_name]
    )
    router = ModelEndpoints(
        {n: FakeHandle(n) for n in counts}, created=1, scale_to_zero=frozenset({"Z"})
    )
    # Deployed before any node can host it: no replica has run yet.
    assert router.readiness() == {"A": "pending", "Z": "ready"}
    counts["A"] = 1
    assert router.readiness() == {"A": "ready", "Z": "ready"}
    counts["A"] = 0  # its node is lost
    assert router.readiness() == {"A": "unavailable", "Z": "ready"}
    counts["A"] = None
    assert router.readiness()["A"] == "unknown"


class InfoHandle(FakeHandle):
    """A handle whose replicas answer `info` with what the test sets (or fail)."""

    def __init__(self) -> None:
        super().__init__("ServiceAi-Pro")
        self.answer: object = ModelInfo("ServiceAi-Pro", 2048)
        self.calls = 0
        self.info = SimpleNamespace(remote=self._remote)

    def _remote(self):
        self.calls += 1
        return serve_response(answer=self.answer)


class WaitingHandle(FakeHandle):
    """A handle whose calls wait for a replica, as Serve's router holds them while the
    deployment has none: the calls are real Serve responses, never assigned."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls: list = []
        self.reply = SimpleNamespace(remote=lambda *a: self._call(DeploymentResponseGenerator))
        self.stream = SimpleNamespace(remote=lambda *a: self._call(DeploymentResponseGenerator))

    def _call(self, kind):
        self.calls.append(serve_response(kind, assigned=False))
        return self.calls[-1]


async def test_calls_waiting_for_a_replica_of_a_type_with_none_left_are_refused_503(monkeypatch):
    """A lost node: Serve would hold these until a node that can host the type is back."""
    counts = {"A": 1, "Z": 0}
    monkeypatch.setattr(
        "app.serving.dispatch.running_replicas", lambda h: counts[h.deployment_name]
    )
    handles = {n: WaitingHandle(n) for n in counts}
    router = ModelEndpoints(handles, created=1, scale_to_zero=frozenset({"Z"}))
    waiting = [
        asyncio.create_task(router.get("A").reply("chat", {}, meter())),
        asyncio.create_task(router.get("A").open_stream("chat", {}, meter())),
        asyncio.create_task(router.get("Z").reply("chat", {}, meter())),
    ]
    await asyncio.sleep(0.01)
    router.refuse_orphans()  # A still has its replica: nothing is refused
    await asyncio.sleep(0.01)
    assert not any(task.done() for task in waiting)

    counts["A"] = 0
    router.refuse_orphans()
    for task in waiting[:2]:
        with pytest.raises(ApiError) as info:
            await asyncio.wait_for(task, timeout=1)
        assert (info.value.status, info.value.code) == (503, "model_unavailable")
        assert info.value.headers["Retry-After"] == "5"
    assert all(call.cancelled() for call in handles["A"].calls)
    # A type that scales to zero starts a replica for its waiting calls: they wait on.
    assert not waiting[2].done() and router.get("Z").has_waiting
    waiting[2].cancel()


async def test_a_caller_that_leaves_cancels_its_call_and_is_no_503(monkeypatch):
    monkeypatch.setattr("app.serving.dispatch.running_replicas", lambda h: 0)
    handle = WaitingHandle("A")
    router = ModelEndpoints({"A": handle}, created=1)
    task = asyncio.create_task(router.get("A").reply("chat", {}, meter()))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handle.calls[0].cancelled()
    assert not router.get("A").has_waiting


async def test_model_info_is_asked_again_after_a_while_so_a_rollout_is_seen(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: clock[0])
    handle = InfoHandle()
    pro = ModelEndpoint("ServiceAi-Pro", handle)
    assert (await pro.info()).max_model_len == 2048
    handle.answer = ModelInfo("ServiceAi-Pro", 256)  # the new engine args rolled out
    assert (await pro.info()).max_model_len == 2048 and handle.calls == 1  # cached
    clock[0] += dispatch.INFO_TTL_S + 1
    assert (await pro.info()).max_model_len == 256
    handle.answer = RayActorError()  # no replica answers: the last answer stands
    clock[0] += dispatch.INFO_TTL_S + 1
    assert (await pro.info()).max_model_len == 256


async def test_model_info_of_a_type_never_reached_is_its_error():
    handle = InfoHandle()
    handle.answer = RayActorError()
    with pytest.raises(ApiError) as info:
        await ModelEndpoint("ServiceAi-Pro", handle).info()
    assert info.value.status == 503


def heard(handle: FakeHandle, config: DeploymentConfig | None) -> FakeHandle:
    """`handle` with its router's state as Ray 2.60 keeps it once the controller sent `config`."""
    metrics = SimpleNamespace(_deployment_config=config)
    handle._router = SimpleNamespace(_asyncio_router=SimpleNamespace(_metrics_manager=metrics))
    return handle


def test_scales_to_zero_is_what_the_controller_told_the_handles_router():
    assert scales_to_zero(FakeHandle("A")) is None
    assert scales_to_zero(heard(FakeHandle("A"), None)) is None
    assert scales_to_zero(heard(FakeHandle("A"), DeploymentConfig(num_replicas=0))) is False
    to_zero = DeploymentConfig(autoscaling_config={"min_replicas": 0, "max_replicas": 1})
    assert scales_to_zero(heard(FakeHandle("A"), to_zero)) is True
    to_one = DeploymentConfig(autoscaling_config={"min_replicas": 1, "max_replicas": 2})
    assert scales_to_zero(heard(FakeHandle("A"), to_one)) is False


def test_types_of_another_application_scale_to_zero_as_serve_says(monkeypatch):
    monkeypatch.setattr("app.serving.dispatch.running_replicas", lambda h: 0)
    to_zero = DeploymentConfig(autoscaling_config={"min_replicas": 0, "max_replicas": 1})
    handles = {"Coder": FakeHandle("Coder"), "Fast": FakeHandle("Fast")}
    # No config of these types here (the ingress names them only): scale_to_zero is None.
    router = ModelEndpoints(handles, created=1, scale_to_zero=None)
    # Not heard yet: neither refused nor reported as missing.
    assert router.readiness() == {"Coder": "unknown", "Fast": "unknown"}
    assert router.resolve("Fast").name == "Fast"
    heard(handles["Coder"], to_zero)
    heard(handles["Fast"], DeploymentConfig(autoscaling_config={"min_replicas": 1}))
    assert router.readiness() == {"Coder": "ready", "Fast": "pending"}
    assert router.resolve("Coder").name == "Coder"  # a request starts its replica
    with pytest.raises(ApiError) as info:
        router.resolve("Fast")
    assert info.value.code == "model_unavailable"


def test_serve_overrules_the_configs_own_scale_to_zero(monkeypatch):
    monkeypatch.setattr("app.serving.dispatch.running_replicas", lambda h: 0)
    handle = FakeHandle("Z")
    router = ModelEndpoints({"Z": handle}, created=1, scale_to_zero=frozenset({"Z"}))
    assert router.resolve("Z").name == "Z"  # not heard yet: the config's word
    heard(handle, DeploymentConfig(num_replicas=1))  # redeployed with a replica always
    with pytest.raises(ApiError) as info:
        router.resolve("Z")
    assert info.value.code == "model_unavailable"


class ReplyHandle(FakeHandle):
    """A handle whose replica answers a whole reply with `parts` (counts, then the body)."""

    def __init__(self, parts: list, then: BaseException | None = None) -> None:
        super().__init__("ServiceAi-Pro")
        self.reply = SimpleNamespace(remote=lambda *a: serve_stream(parts, then))


async def test_a_whole_reply_is_its_body_after_the_counts_so_far():
    parts = [ReplyPart(b"", 7, 0), ReplyPart(b"", 7, 40), ReplyPart(b'{"id": 1}', 7, 64, 200)]
    reply = await ModelEndpoint("ServiceAi-Pro", ReplyHandle(parts)).reply("chat", {}, meter())
    assert reply == parts[-1]


async def test_a_large_whole_reply_is_joined_from_its_parts():
    parts = [ReplyPart(b"", 7, 0), ReplyPart(b'{"id": ', 7, 64), ReplyPart(b"1}", 7, 64, 200)]
    reply = await ModelEndpoint("ServiceAi-Pro", ReplyHandle(parts)).reply("chat", {}, meter())
    assert (reply.data, reply.completion_tokens) == (b'{"id": 1}', 64)


async def test_a_whole_reply_left_by_its_client_has_the_last_counts_on_its_meter():
    handle = ReplyHandle([ReplyPart(b"", 7, 0), ReplyPart(b"", 7, 40)])  # then still at work
    counted = meter()
    task = asyncio.create_task(ModelEndpoint("ServiceAi-Pro", handle).reply("chat", {}, counted))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (counted.prompt_tokens, counted.completion_tokens) == (7, 40)


async def test_a_failed_whole_reply_counts_the_replicas_own_counts_else_the_last_seen():
    failure = EngineUnavailable("engine stopped")
    failure.prompt_tokens, failure.completion_tokens = 7, 52
    endpoint = ModelEndpoint("ServiceAi-Pro", ReplyHandle([ReplyPart(b"", 7, 40)], failure))
    counted = meter()
    with pytest.raises(ApiError) as info:
        await endpoint.reply("chat", {}, counted)
    assert info.value.status == 503
    assert (counted.prompt_tokens, counted.completion_tokens) == (7, 52)
    endpoint = ModelEndpoint("ServiceAi-Pro", ReplyHandle([ReplyPart(b"", 7, 40)], RayActorError()))
    counted = meter()
    with pytest.raises(ApiError) as info:
        await endpoint.reply("chat", {}, counted)
    assert info.value.code == "model_unavailable"
    assert (counted.prompt_tokens, counted.completion_tokens) == (7, 40)


def meter() -> Meter:
    """A meter whose charges go nowhere (the ticket's are tested in tests/app/limits)."""
    return Meter(lambda prompt, completion: asyncio.get_running_loop().create_future())


class MeasuringHandle(FakeHandle):
    """A handle whose replicas answer `prompt_tokens` with what the test sets (or raise it)."""

    def __init__(self, answer: object) -> None:
        super().__init__("ServiceAi-Fast")
        self.asked: list[tuple] = []
        self.prompt_tokens = SimpleNamespace(remote=self._remote)
        self.answer = answer

    def _remote(self, *args):
        self.asked.append(args)
        return serve_response(answer=self.answer)


async def test_a_replica_measures_a_prompt_or_refuses_it_as_generation_would():
    measured = ModelEndpoint("ServiceAi-Fast", MeasuringHandle(612))
    assert await measured.prompt_tokens("chat", {"messages": []}) == 612
    assert measured.handle.asked == [("chat", {"messages": []})]
    refused = ModelEndpoint("ServiceAi-Fast", MeasuringHandle(too_long()))
    with pytest.raises(ApiError) as error:
        await refused.prompt_tokens("completion", {"prompt": "x"})
    assert (error.value.status, error.value.code) == (400, "context_length_exceeded")
    await asyncio.sleep(0)  # the assignment's callbacks run on the loop's next turn
    assert not refused.has_waiting
