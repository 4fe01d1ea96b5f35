"""The Ray Serve deployment of one model type: each replica holds one vLLM engine."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

from ray import serve
from ray.serve import Application

from deployments.config import TINY_MODEL, ModelTypeConfig, tiny_model_dir
from deployments.generation import GenerationChunk, GenerationRequest, ModelInfo

logger = logging.getLogger("ray.serve")


@serve.deployment
class ModelServer:
    """Streams generations of one model type. Options come from `ModelTypeConfig.serve_options`."""

    def __init__(self, config: ModelTypeConfig) -> None:
        from deployments.engine import VllmEngine

        self._name = config.name
        model = config.resolved_model()
        if model == TINY_MODEL:
            from deployments.tiny_model import ensure

            model = str(ensure(tiny_model_dir()))
        logger.info("Starting the engine of %s", self._name)
        self._engine = VllmEngine.start(config.engine_kwargs(model))
        logger.info("%s ready: max_model_len=%d", self._name, self._engine.max_model_len)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        async for chunk in self._engine.stream(request):
            yield chunk

    async def complete(self, request: GenerationRequest) -> GenerationChunk:
        return await self._engine.complete(request)

    async def info(self) -> ModelInfo:
        return ModelInfo(self._name, self._engine.max_model_len)

    async def running_requests(self) -> int:
        """Requests the engine still holds; tests use it to prove that aborts free the engine."""
        return self._engine.running_requests()

    async def check_health(self) -> None:
        await self._engine.check_health()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()


def build_model_app(config: ModelTypeConfig) -> Application:
    """Bind the model deployment of one model type with its Serve options."""
    return ModelServer.options(**config.serve_options()).bind(config)


def ensure_local_model(config: ModelTypeConfig) -> Path | None:
    """Generate the tiny model up front when this type serves it (keeps replica start fast)."""
    if config.resolved_model() != TINY_MODEL:
        return None
    from deployments.tiny_model import ensure

    return ensure(tiny_model_dir())
