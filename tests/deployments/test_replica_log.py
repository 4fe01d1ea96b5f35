"""A replica's Serve log keeps its file when vLLM applies its logging config."""

from __future__ import annotations

import logging
import logging.config
from logging.handlers import MemoryHandler

from deployments.replica_log import kept_through_logging_setup


def test_records_after_a_dict_config_still_reach_the_replicas_file(tmp_path):
    log_file = tmp_path / "replica.log"
    logger = logging.getLogger("serviceai.test.replica")
    logger.propagate = False
    handler = MemoryHandler(1000, flushLevel=logging.ERROR, target=logging.FileHandler(log_file))
    logger.addHandler(handler)
    try:
        with kept_through_logging_setup(logger.name):
            # What vLLM's AsyncLLM does at start: a dictConfig closes every handler.
            logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
        logger.error("after the engine started")
        assert "after the engine started" in log_file.read_text()
        assert not handler.buffer
    finally:
        logger.removeHandler(handler)
        handler.close()
