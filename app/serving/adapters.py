"""LoRA adapters as clients call them (`Type:adapter`): those a type's config holds, which its
replicas load at start, and those operators register while the service runs (the CLI, the
admin API), which a replica loads from their path the first time a request names one.

Each ingress replica reads the registered ones from the store at most every `ttl_s`, as it
trusts a verified key (a registration or a removal reaches every replica within that time; the
admin API's own replica at once), and keeps its last reading while the store is away.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from app.accounts.keystore import KeyStore
from app.accounts.keystore.errors import StoreUnavailable
from app.openai.errors import ApiError
from app.serving.endpoints import ModelEndpoints
from deployments.wire import ModelInfo

logger = logging.getLogger("ray.serve")


class RegisteredAdapters:
    """The store's registered adapters, `Type:name` -> path per model type, read at most
    every `ttl_s`."""

    def __init__(
        self,
        store: KeyStore,
        ttl_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        roots: Sequence[Path] = (),
        hub_ids: bool = True,
    ) -> None:
        """`roots`, `hub_ids`: where a registered adapter's path may point (check_adapter_path)."""
        self.roots = roots
        self.hub_ids = hub_ids
        self._store = store
        self._ttl_s = ttl_s
        self._clock = clock
        self._read_at = -math.inf
        self._paths: dict[str, dict[str, str]] | None = None
        self._reading = asyncio.Lock()

    async def paths(self, model_type: str) -> dict[str, str]:
        """A type's registered adapters: the path of each by the name clients call it."""
        if self._clock() - self._read_at >= self._ttl_s:
            async with self._reading:
                if self._clock() - self._read_at >= self._ttl_s:
                    await self._read()
        return (self._paths or {}).get(model_type, {})

    async def _read(self) -> None:
        try:
            adapters = await self._store.adapters()
        except StoreUnavailable:
            if self._paths is None:
                raise
            logger.warning("Registered adapters: the store is away; the last reading stays")
            return
        paths: dict[str, dict[str, str]] = {}
        for adapter in adapters:
            paths.setdefault(adapter.model, {})[adapter.id] = adapter.path
        self._paths = paths
        self._read_at = self._clock()

    def forget(self) -> None:
        """Read the store again on the next request (after this replica changed it)."""
        self._read_at = -math.inf


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A Hugging Face id, `owner/name`: no leading dot or slash, no `..`."""


def check_adapter_path(path: str, roots: Sequence[Path], hub_ids: bool = True) -> None:
    """A registered adapter's path: a folder inside one of `roots` (its real path: no symlink
    or `..` leads out), or where `hub_ids` a Hugging Face id; a 400 naming `path` otherwise."""
    # An id that is a folder here would be read from the nodes' disks as a relative path.
    if hub_ids and HUB_ID.fullmatch(path) and ".." not in path and not os.path.exists(path):
        return
    if Path(path).is_absolute() and path.isprintable():  # a NUL byte is no path anywhere
        real = Path(os.path.realpath(path))
        if any(real.is_relative_to(os.path.realpath(r)) for r in roots):
            return
    # The roots are the server's folders: named by the setting, never shown to a client.
    raise ApiError(
        400,
        "An adapter's path must be a folder inside one of SERVICEAI_ADAPTER_ROOTS"
        + (" or a Hugging Face id (owner/name)" if hub_ids else "")
        + f": '{path[:200]}' is neither. Copy the adapter into one of them, or ask for its "
        "folder to be added.",
        param="path",
        code="adapter_path_not_allowed",
    )


async def adapter_path(
    registered: RegisteredAdapters, adapter: str | None, model: ModelInfo
) -> str | None:
    """The path a replica loads `adapter` from: None for no adapter or one the type's config
    holds (its replicas hold it from the start), a registered one's path; a 404 naming the
    type's adapters for any other."""
    if adapter is None or adapter in model.adapters:
        return None
    paths = await registered.paths(model.name)
    check_adapter(adapter, model.name, (*model.adapters, *paths))
    if not model.lora:
        raise ApiError(
            503,
            f"{adapter} is registered, but {model.name}'s engine takes no LoRA adapters "
            "(its config sets no `adapters` and no engine_args.enable_lora). Tell the operator.",
            param="model",
            code="model_unavailable",
        )
    return paths[adapter]


def check_adapter(adapter: str, model_type: str, held: tuple[str, ...]) -> None:
    """An adapter the type does not hold (`held`: configured and registered) is a model that
    does not exist: 404, naming none (GET /v1/models lists those the caller's key may call)."""
    if adapter not in held:
        raise ApiError(
            404,
            f"The model '{adapter[:100]}' does not exist: {model_type} has no adapter of that "
            "name. GET /v1/models lists the adapters this API key may call.",
            param="model",
            code="model_not_found",
        )


async def adapters_of(
    models: ModelEndpoints, registered: RegisteredAdapters, model_type: str
) -> list[str]:
    """A type's adapters as /v1/models lists them: its config's, then the registered ones."""
    held = list(await models.adapters(model_type))
    try:
        paths = await registered.paths(model_type)
    except StoreUnavailable:
        return held  # the list stays whole for the types and their configured adapters
    return held + [name for name in paths if name not in held]


async def check_registrable(models: ModelEndpoints, model_type: str, name: str) -> None:
    """A 400 where `model_type` is not a type's own name or, as its running replicas say,
    serves no LoRA adapters; a 409 where its config holds an adapter of that name. A type with
    no replica now (one that scales to zero) is taken at its word: a replica that cannot load
    the adapter answers its requests with a 503 saying so."""
    if model_type not in models.names:
        raise ApiError(
            400,
            f"There is no model type '{model_type[:64]}'. Model types: {', '.join(models.names)}.",
            param="model",
            code="model_not_found",
        )
    if not models.get(model_type).running():
        return
    model = await models.get(model_type).info()
    if model.embedding or not model.lora:
        raise ApiError(
            400,
            f"{model_type} takes no LoRA adapters: "
            + (
                "an embedding type generates nothing."
                if model.embedding
                else "set its engine_args.enable_lora (and max_lora_rank) in the config."
            ),
            param="model",
            code="model_not_supported",
        )
    if f"{model_type}:{name}" in model.adapters:
        raise ApiError(
            409,
            f"{model_type}'s config holds an adapter named '{name}' already.",
            param="name",
            code="adapter_exists",
        )
