"""Model families and what vLLM needs to read each one's tool calls and reasoning: a type whose
`SERVICEAI_MODEL_*` variable names another model gets that model's parsers, not those configured
for the model it replaces (deployments.model_type, `as_run`), and the GPU profile picks its
models' parsers here (deployments.gpu_profile)."""

from __future__ import annotations

import re
from dataclasses import dataclass


class UnknownFamily(ValueError):
    """A model whose parsers are unknown here, naming what to set instead."""


@dataclass(frozen=True)
class Parsers:
    """What vLLM needs to read a model family's tool calls and reasoning."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    think: tuple[str, str] | None = None
    """The strings that open and close reasoning (`reasoning_config`: Anthropic's thinking
    budget ends reasoning there)."""
    embed: bool = False


FAMILIES: tuple[tuple[str, Parsers], ...] = (
    (r"qwen3-embedding", Parsers(embed=True)),
    (r"qwen3", Parsers("hermes", "qwen3", ("<think>", "</think>"))),
    (r"qwen2\.5", Parsers("hermes")),
    (r"llama-3\.[123]", Parsers("llama3_json")),
    (r"mistral", Parsers("mistral")),
    (r"deepseek-r1-distill", Parsers(None, "deepseek_r1", ("<think>", "</think>"))),
    (r"granite-3", Parsers("granite")),
)
"""Model families by a pattern of their Hugging Face id (case ignored), first match wins."""


def parsers_for(model: str) -> Parsers:
    """The parsers of `model`'s family, or an UnknownFamily naming what to set."""
    for pattern, parsers in FAMILIES:
        if re.search(pattern, model, re.IGNORECASE):
            return parsers
    known = ", ".join(pattern.replace("\\", "") for pattern, _ in FAMILIES)
    raise UnknownFamily(
        f"{model}: its tool-call and reasoning parsers are unknown here (families known: "
        f"{known}). Set tool_call_parser and reasoning_parser for its type in the serve config "
        "(vLLM's docs list them), or pick a model of a known family."
    )
