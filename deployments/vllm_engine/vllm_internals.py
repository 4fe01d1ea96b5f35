"""vLLM's internals that this service patches, reads or calls, all listed here, checked at start.

vLLM has no public hook for what the adapter mends or measures: forced calls that skip the
structural tag (`forced_tool_calls`), rewindable seeded sampling on CPU (`seeded_sampling`),
JSON-schema strings held to JSON (`strict_json`), a time budget on each grammar's compile
(`grammar_budget`), Anthropic's prefill (`messages`), a prompt's length as the serving layer
renders it (an embedding request's inputs too: `embeddings`), adapters loaded at run time
(`adapters`), and the Responses handler built on the replica's own engine (`responses`). Those
modules do the work; this one names every private surface they touch. Each replica calls
`check()` before it builds its engine: a vLLM whose internals moved fails there, naming what
moved and which module needs it, instead of mid-request or, for a patch, silently unapplied.
Pinned by the exact vLLM version in pyproject.toml; tests/deployments/vllm_engine/
test_vllm_internals.py checks that every patch in the folder is listed.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

from deployments.attributes import attributes_set


class Surface(NamedTuple):
    """One thing of vLLM's that a module here relies on: `path` in `module` (a class's
    attribute as `Class.name`), and for a callable the keywords it is called with."""

    module: str
    path: str
    user: str
    """The module here that needs it, and why."""
    keywords: tuple[str, ...] = ()


PATCHED = (
    Surface(
        "vllm.parser.abstract_parser",
        "DelegatingParser._apply_structural_tag",
        "forced_tool_calls: a forced call takes the JSON-schema path, not the tag",
    ),
    Surface(
        "vllm.tool_parsers.abstract_tool_parser",
        "ToolParser.supports_required_and_named",
        "forced_tool_calls: every parser serves forced calls from JSON",
    ),
    Surface(
        "vllm.v1.worker.gpu_input_batch",
        "CachedRequestState.__post_init__",
        "seeded_sampling: a seeded request's generator can rewind",
    ),
    Surface(
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._sample",
        "seeded_sampling: generators are marked before each step",
    ),
    Surface(
        "vllm.v1.structured_output.backend_xgrammar",
        "XgrammarBackend.__post_init__",
        "strict_json: schema strings compile to JSON characters",
    ),
    Surface(
        "vllm.v1.structured_output.backend_xgrammar",
        "XgrammarBackend.__post_init__",
        "grammar_budget: a compile past its budget fails its request",
    ),
    Surface(
        "vllm.entrypoints.anthropic.serving",
        "AnthropicServingMessages.to_chat_completion_request",
        "messages: a final assistant message is continued (Anthropic's prefill)",
    ),
)
"""Replaced in this process (the plugins in each engine core, forced calls in the replica)."""

READ = (
    Surface("vllm.v1.worker.gpu_input_batch", "CachedRequestState.generator", "seeded_sampling"),
    Surface("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.input_batch", "seeded_sampling"),
    Surface("vllm.v1.worker.gpu_input_batch", "InputBatch.generators", "seeded_sampling"),
    Surface(
        "vllm.v1.structured_output.backend_xgrammar", "XgrammarBackend.compiler", "strict_json"
    ),
    Surface(
        "vllm.v1.structured_output.backend_xgrammar", "XgrammarBackend.compiler", "grammar_budget"
    ),
    Surface("vllm.exceptions", "GenerationError", "replies: the engine ended a request in error"),
    Surface(
        "vllm.tool_parsers.abstract_tool_parser",
        "ToolParserManager.register_module",
        "forced_tool_calls: the parser of a type with none",
        ("name", "module", "force"),
    ),
    Surface(
        "vllm.entrypoints.openai.chat_completion.serving",
        "OpenAIServingChat.render_chat_request",
        "completions: a chat prompt's length",
    ),
    Surface(
        "vllm.entrypoints.openai.completion.serving",
        "OpenAIServingCompletion.render_completion_request",
        "completions: a completion prompt's length",
    ),
    Surface(
        "vllm.renderers.inputs.preprocess",
        "extract_prompt_len",
        "completions: lengths (and responses)",
    ),
    Surface(
        "vllm.entrypoints.openai.responses.serving",
        "OpenAIServingResponses.online_renderer",
        "responses: a Responses prompt's length",
    ),
    Surface(
        "vllm.renderers.online_renderer",
        "OnlineRenderer.render_responses",
        "responses: a Responses prompt's length",
    ),
    Surface(
        "vllm.renderers.online_renderer",
        "OnlineRenderer",
        "responses: the Responses handler's renderer",
        (
            "model_config",
            "renderer",
            "request_logger",
            "chat_template",
            "chat_template_content_format",
            "trust_request_chat_template",
            "trust_request_mm_kwargs",
            "enable_auto_tools",
            "exclude_tools_when_tool_choice_none",
            "tool_parser",
            "tool_strict_level",
            "reasoning_parser",
            "default_chat_template_kwargs",
            "log_error_stack",
        ),
    ),
    Surface(
        "vllm.entrypoints.openai.responses.serving",
        "OpenAIServingResponses",
        "responses: the handler on the replica's engine",
        (
            "request_logger",
            "chat_template",
            "chat_template_content_format",
            "enable_auto_tools",
            "tool_parser",
            "reasoning_parser",
            "enable_prompt_tokens_details",
        ),
    ),
    Surface(
        "vllm.entrypoints.openai.models.serving",
        "OpenAIServingModels",
        "responses: the served name",
        ("engine_client", "base_model_paths"),
    ),
    Surface(
        "vllm.entrypoints.anthropic.serving",
        "AnthropicServingMessages.create_messages",
        "messages: Anthropic's Messages API",
    ),
    Surface(
        "vllm.entrypoints.anthropic.serving",
        "AnthropicServingMessages.count_tokens",
        "messages: a Messages prompt's length",
    ),
    Surface(
        "vllm.entrypoints.pooling.base.serving",
        "PoolingBaseServing._init_ctx",
        "embeddings: the inputs' length",
    ),
    Surface(
        "vllm.entrypoints.pooling.embed.serving",
        "ServingEmbedding._preprocessing",
        "embeddings: the inputs' length",
    ),
    Surface(
        "vllm.entrypoints.pooling.typing",
        "PoolingServeContext.engine_inputs",
        "embeddings: the inputs' length",
    ),
    Surface(
        "vllm.entrypoints.openai.models.protocol",
        "LoRAModulePath",
        "engine: a type's adapters, as `vllm serve --lora-modules` names them",
        ("name", "path"),
    ),
    Surface(
        "vllm.entrypoints.openai.models.serving",
        "OpenAIServingModels.lora_requests",
        "adapters: the serving layer finds an adapter loaded at run time there, by name",
    ),
    Surface(
        "vllm.lora.request",
        "LoRARequest",
        "adapters: an adapter loaded at run time, under an id of its own",
        ("lora_name", "lora_int_id", "lora_path"),
    ),
    Surface(
        "vllm.entrypoints.launchers.api_server.app_state",
        "init_app_state",
        "engine: vLLM's serving layer, built as `vllm serve` builds it",
    ),
    Surface(
        "vllm.engine.arg_utils",
        "AsyncEngineArgs._api_process_count",
        "shared_engine: the engine core's client count, as `vllm serve` sets it",
    ),
    Surface(
        "vllm.engine.arg_utils",
        "AsyncEngineArgs._api_process_rank",
        "shared_engine: a client's index",
    ),
    Surface(
        "vllm.v1.engine.utils",
        "get_engine_zmq_bind_addresses",
        "shared_engine: the clients' sockets",
    ),
    Surface(
        "vllm.v1.engine.utils",
        "EngineZmqAddresses",
        "shared_engine: the clients' sockets, as the core gets them",
        ("inputs", "outputs"),
    ),
    Surface(
        "vllm.v1.engine.utils",
        "launch_core_engines",
        "shared_engine: one core for several clients",
        ("vllm_config", "executor_class", "log_stats", "addresses"),
    ),
    Surface(
        "vllm.v1.engine.utils",
        "CoreEngineLaunch.engine_manager",
        "shared_engine: the core's processes",
    ),
    Surface(
        "vllm.v1.engine.async_llm",
        "AsyncLLM",
        "shared_engine: a client of a core launched apart",
        ("vllm_config", "executor_class", "client_addresses", "client_count", "client_index"),
    ),
    Surface(
        "vllm.v1.engine.core_client",
        "BackgroundResources.engine_manager",
        "shared_engine: client 0 owns the core",
    ),
    Surface(
        "vllm.v1.engine.core_client",
        "MPClient.start_engine_core_monitor",
        "shared_engine: client 0 watches the core",
    ),
    Surface(
        "vllm.v1.engine.core_client",
        "BackgroundResources.engine_dead",
        "shared_engine: another client marks the core dead, as vLLM's monitor does",
    ),
    Surface(
        "vllm.v1.engine.core_client",
        "MPClient.shutdown",
        "shared_engine: another client's sockets closed on the core's death",
    ),
)
"""Read or called: private names, and public ones called with keywords that may move."""


def check(surfaces: tuple[Surface, ...] = PATCHED + READ) -> None:
    """Raise, naming the first surface this vLLM no longer has, and the module that needs it."""
    for surface in surfaces:
        problem = _missing(surface)
        if problem is not None:
            raise RuntimeError(
                f"vLLM's {surface.module}.{surface.path} {problem}, which ServiceAi's "
                f"deployments/vllm_engine/{surface.user.split(':')[0]}.py needs "
                "(deployments/vllm_engine/vllm_internals.py): this vLLM is not the version "
                "pyproject.toml pins."
            )


def _missing(surface: Surface) -> str | None:
    """What is wrong with `surface` in this vLLM, or None."""
    try:
        found: Any = importlib.import_module(surface.module)
    except ImportError:
        return "cannot be imported"
    *owners, name = surface.path.split(".")
    for part in owners:
        found = getattr(found, part, None)
        if found is None:
            return f"is gone ({part} is missing)"
    if not hasattr(found, name) and not (isinstance(found, type) and name in attributes_set(found)):
        return "is gone"
    target = getattr(found, name, None)
    if surface.keywords and target is not None:
        accepted = inspect.signature(target).parameters
        moved = [keyword for keyword in surface.keywords if keyword not in accepted]
        if moved:
            return f"no longer takes {', '.join(moved)}"
    return None


def wrap_xgrammar_compiler(marker: str, wrap: Callable[[Any], Any]) -> None:
    """Every xgrammar backend vLLM builds in this process compiles through `wrap(compiler)`
    (`XgrammarBackend.__post_init__` and `.compiler`, listed above). `marker` names the wrap:
    a plugin may load more than once in a process, and its wrap is made once."""
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    if getattr(XgrammarBackend.__post_init__, marker, False):
        return
    post_init = XgrammarBackend.__post_init__

    @functools.wraps(post_init)
    def wrapped_post_init(self: XgrammarBackend) -> None:
        post_init(self)
        self.compiler = wrap(self.compiler)

    setattr(wrapped_post_init, marker, True)
    XgrammarBackend.__post_init__ = wrapped_post_init  # type: ignore[method-assign]
