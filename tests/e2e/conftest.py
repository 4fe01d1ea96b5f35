"""Clients of the real stack. Every test in this folder runs against Ray Serve + vLLM on CPU."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import openai
import pytest
from playwright.sync_api import Browser, sync_playwright
from transformers import AutoTokenizer

from deployments.model_type import tiny_model_dir
from tests.conftest import Stack
from tests.e2e.browser import CHROMIUM

MODEL_TYPES = ["ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder"]
"""The types that generate: every API but embeddings."""
ALL_TYPES = [*MODEL_TYPES, "ServiceAi-Embed"]
"""Every type the local profile serves, in its order."""


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


@asynccontextmanager
async def async_clients(base_url: str, *keys: str) -> AsyncIterator[tuple[openai.AsyncOpenAI, ...]]:
    """One async client per key, closed on the way out.

    Every async test here shares one event loop (pyproject.toml: the session's). An async
    client a test leaves to the garbage collector hung a later test's request: the whole reply
    sat in its socket's buffer while the task waited for anyio's read event, as if the loop no
    longer watched that file descriptor (bench/NOTES.md, "The hang was the test's client").
    """
    async with AsyncExitStack() as stack:
        yield tuple(
            [
                await stack.enter_async_context(
                    openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
                )
                for key in keys
            ]
        )


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
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """Debian's Chromium, driven by Playwright (which downloads no browser here)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()
