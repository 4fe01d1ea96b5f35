"""A model replica's Serve log survives vLLM's logging set-up.

Serve writes a replica's log through a `MemoryHandler` whose target is the replica's log file.
vLLM's `AsyncLLM` applies its logging config with `logging.config.dictConfig`, which closes
every handler in the process first: the memory handler lost its target, so nothing the replica
logged after its engine started reached the file (its errors included), and the records piled
up in the handler's buffer for the life of the replica. Here the targets are put back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from logging.handlers import MemoryHandler

SERVE_LOGGER = "ray.serve"


@contextmanager
def kept_through_logging_setup(logger_name: str = SERVE_LOGGER) -> Iterator[None]:
    """Restore, after the block, the targets of the logger's memory handlers (a closed file
    handler opens its file again on the next record)."""
    handlers = [h for h in logging.getLogger(logger_name).handlers if isinstance(h, MemoryHandler)]
    targets = [(handler, handler.target) for handler in handlers]
    try:
        yield
    finally:
        for handler, target in targets:
            if handler.target is None:
                handler.setTarget(target)
