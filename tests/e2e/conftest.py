"""Clients of the real stack. Every test in this folder runs against Ray Serve + vLLM on CPU."""

from __future__ import annotations

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from deployments.model_type import tiny_model_dir
from tests.conftest import Stack

MODEL_TYPES = ["ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder"]


LAST = "test_secrets_in_logs.py"


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)
    # The log check reads what every other test made the stack log: it runs last.
    items.sort(key=lambda item: item.path.name == LAST)


@pytest.fixture(scope="session")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=0)


@pytest.fixture(scope="session")
def async_client(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=0)


@pytest.fixture(scope="session")
def http(stack: Stack) -> httpx.Client:
    with httpx.Client(
        base_url=stack.origin, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=60
    ) as c:
        yield c


@pytest.fixture(scope="session")
def tokenizer(stack: Stack):
    return AutoTokenizer.from_pretrained(tiny_model_dir())


def prompt_tokens(tokenizer, messages: list[dict[str, str]]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


def serviceai_cli(database_url: str, *args: str) -> dict:
    """Run the installed `serviceai` command on a store and return its --json output."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "SERVICEAI_DATABASE_URL": database_url}
    result = subprocess.run(
        [str(Path(sys.executable).with_name("serviceai")), *args],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
