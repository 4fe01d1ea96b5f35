"""Clients of the real stack. Every test in this folder runs against Ray Serve + vLLM on CPU."""

from __future__ import annotations

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from deployments.config import tiny_model_dir
from tests.conftest import Stack

MODEL_TYPES = ["ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder"]


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)


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
