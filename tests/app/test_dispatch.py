from types import SimpleNamespace

import pytest
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from app.dispatch import ModelEndpoint, ModelRouter, _has_no_healthy_replica
from app.errors import ApiError
from deployments.generation import ContextLengthExceeded, EngineUnavailable


class FakeHandle:
    def __init__(self, name: str, app: str = "serviceai") -> None:
        self.deployment_name = name
        self.app_name = app

    def options(self, **kwargs):
        return self


def endpoint(name: str = "ServiceAi-Pro") -> ModelEndpoint:
    return ModelEndpoint(name, FakeHandle(name))


def test_generation_errors_keep_their_status_and_code():
    error = endpoint().error(ContextLengthExceeded("too long"))
    assert (error.status, error.code, error.param, error.message) == (400, "context_length_exceeded", "messages", "too long")


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


async def test_router_404_lists_models_and_503_when_unhealthy(monkeypatch):
    router = ModelRouter({n: FakeHandle(n) for n in ("A", "B")}, created=1)
    with pytest.raises(ApiError) as info:
        await router.resolve("C")
    assert info.value.status == 404 and info.value.message.endswith("Available models: A, B.")
    statuses = iter([status_with("UPDATING", 0, name="B"), status_with("HEALTHY", 1, name="B")])
    monkeypatch.setattr("app.dispatch.serve.status", lambda: next(statuses))
    await router.refresh_health()
    assert (await router.resolve("A")).name == "A"
    assert router.get("B").name == "B"
    with pytest.raises(ApiError) as info:
        await router.resolve("B")  # the view is fresh: refused without asking again
    assert info.value.status == 503
    router._refreshed_at -= 1
    assert (await router.resolve("B")).name == "B"  # a stale refusal is re-checked first


def status_with(status: str, running: int, name: str = "A"):
    deployment = SimpleNamespace(status=status, replica_states={"RUNNING": running} if running else {"STARTING": 1})
    return SimpleNamespace(applications={"serviceai": SimpleNamespace(deployments={name: deployment})})


@pytest.mark.parametrize(
    ("status", "running", "scales_to_zero", "unhealthy"),
    [
        ("HEALTHY", 1, False, False),
        ("UNHEALTHY", 1, False, False),
        ("UNHEALTHY", 0, False, True),
        ("DEPLOY_FAILED", 0, False, True),
        ("UPDATING", 0, False, True),  # starting, or failing to start: do not queue forever
        ("UPSCALING", 0, True, False),  # a cold start from zero: requests wait for it
        ("HEALTHY", 0, True, False),
        ("DEPLOY_FAILED", 0, True, True),
    ],
)
def test_no_healthy_replica(status, running, scales_to_zero, unhealthy):
    handle = FakeHandle("A")
    assert _has_no_healthy_replica(status_with(status, running), handle, scales_to_zero) is unhealthy
