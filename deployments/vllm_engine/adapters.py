"""LoRA adapters registered while the service runs, loaded into this engine on demand.

The ingress sends a registered adapter's path with every request that names it
(deployments.wire.ADAPTER_PATH); the first such request loads it (the engine reads it into its
CPU cache, as `vllm serve`'s `/v1/load_lora_adapter` does) and every later one finds it held.
Which adapters sit in the engine's GPU slots (`max_loras`) and CPU cache (`max_cpu_loras`) is
the engine's own least-recently-used choice; an adapter it dropped is read again from its path
by the request that needs it. The ingress's router sends an adapter's requests to one home
replica, so a burst on one adapter loads it once, not on every replica: `serviceai_adapter_loads`
counts the loads.

An adapter's id in the engine is derived from its name and path, not counted: the serving
processes of one engine (deployments.serving_processes) each load what their requests name,
and the engine core they share must see one adapter under one id, and two under two.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import defaultdict
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from ray.util.metrics import Counter
from vllm.lora.request import LoRARequest

from deployments.wire import EngineUnavailable, ReplyPart

logger = logging.getLogger("ray.serve.serviceai")

LOADS = Counter(
    "serviceai_adapter_loads",
    description="LoRA adapters registered at run time, loaded by a model replica (or one of "
    "its serving processes) from their path: once per replica that serves one, unless its "
    "path changes.",
    tag_keys=("model_type", "adapter"),
)

RUNTIME_IDS = 1 << 20
"""Ids of adapters loaded at run time start here: the config's take 1, 2, ... in order."""


def adapter_id(name: str, path: str) -> int:
    """The engine's id of adapter `name` at `path`: the same in every process, another for
    another path (the engine caches an adapter's weights by id)."""
    return RUNTIME_IDS + zlib.crc32(f"{name}\0{path}".encode()) % (1 << 30)


class RuntimeAdapters:
    """Registered adapters in one serving process: vLLM's serving layer finds an adapter by
    name among its models' `lora_requests` (as `--lora-modules` and `/v1/load_lora_adapter`
    put them there), so each one loaded here goes there too."""

    def __init__(self, model_type: str, models: Any, engine: Any) -> None:
        self._model_type = model_type
        self._models = models
        self._engine = engine
        self._loading: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def held(self, name: str, path: str) -> bool:
        request = self._models.lora_requests.get(name)
        return request is not None and request.lora_path == path

    async def load(self, name: str, path: str) -> None:
        """Hold adapter `name` from `path` (a registration may have moved it): one load,
        whatever the requests that wait for it."""
        if self.held(name, path):
            return
        async with self._loading[name]:
            if self.held(name, path):
                return
            request = LoRARequest(
                lora_name=name, lora_int_id=adapter_id(name, path), lora_path=path
            )
            try:
                await self._engine.add_lora(request)
            except Exception as exc:
                logger.warning("LoRA adapter %s could not be loaded from %s: %s", name, path, exc)
                raise EngineUnavailable(
                    f"The adapter {name} is registered but could not be loaded; tell the "
                    "operator (its path may be wrong, or its rank above the type's "
                    "max_lora_rank)."
                ) from None
            self._models.lora_requests[name] = request
            LOADS.inc(tags={"model_type": self._model_type, "adapter": name})
            logger.info("Loaded LoRA adapter %s from %s", name, path)

    async def loaded_first(
        self, name: str, path: str, parts: AsyncGenerator[ReplyPart, None]
    ) -> AsyncGenerator[ReplyPart, None]:
        """`parts` of a request for adapter `name`, once the adapter is held."""
        async with aclosing(parts):
            await self.load(name, path)
            async for part in parts:
                yield part
