"""What a request must pass before it is admitted, the same on every API: the API served by
the type, the reply's length against the context, reasoning and tools against the model, and
the prompt (or an embedding request's inputs) measured where a body may be too long, before
any rate-limit counter moves."""

from __future__ import annotations

from typing import NamedTuple

from app.accounts.auth import Caller
from app.limits.admission import RateLimits
from app.openai.errors import ApiError
from app.openai.protocol import ReplyLength
from app.serving.dispatch import ModelEndpoint
from deployments.wire import Api, ModelInfo

PROMPT_BYTES_BOUND = 2
"""Most tokens a rendered prompt may have per byte of its request body (check_prompt_length)."""


class InputSize(NamedTuple):
    """An embedding request's inputs: how many, and their tokens (all, and the longest input),
    `exact` for token ids, else at most that many."""

    inputs: int
    tokens: int
    longest: int
    exact: bool


def check_api_served(api: Api, model: ModelInfo) -> None:
    """An embedding type serves /v1/embeddings alone, and a type that generates every API but
    that one: a 400 naming the model and the API, the same on every API."""
    if model.embedding == (api == Api.EMBEDDINGS):
        return
    if model.embedding:
        served = f"an embedding model: it serves {Api.EMBEDDINGS.path} only"
    else:
        served = f"a model that generates text: it does not serve {Api.EMBEDDINGS.path}"
    raise ApiError(
        400,
        f"{model.name} is {served}, not {api.path}. Use a model type that serves "
        f"{api.path} (GET /v1/models lists them).",
        param="model",
        code="model_not_supported",
    )


def check_reply_length(reply: ReplyLength, model: ModelInfo) -> None:
    """A reply limit at or beyond the context can never be served: 400, before any counter."""
    limit, field = reply.each, reply.field
    if limit is not None and limit >= model.max_model_len:
        raise ApiError(
            400,
            f"{field} is too large: {limit}. This model's maximum context length is "
            f"{model.max_model_len} tokens, prompt included; request fewer completion tokens.",
            param=field,
            code="context_length_exceeded",
        )


def check_reasoning(model: ModelInfo, asked: bool, param: str) -> None:
    """A request that asks the model to reason (`param`, the API's own field) needs a type with
    a reasoning parser: the same 400 on every API."""
    if asked and model.reasoning_parser is None:
        raise ApiError(
            400,
            f"{model.name} does not reason before answering: {param} is not supported on it; "
            "leave it out, or use a model type that reasons.",
            param=param,
            code="unsupported_parameter",
        )


def check_tools(model: ModelInfo, tools: object, tool_choice: object) -> None:
    """An automatic tool choice needs the type's tool-call parser (its model's call format); a
    forced one (`required`, a named function) is served on every type, as JSON constrained to
    the schema, and 'none' calls nothing."""
    automatic = tool_choice is None or tool_choice == "auto"
    if tools and automatic and model.tool_call_parser is None:
        raise ApiError(
            400,
            f"{model.name} has no tool-call parser, so it cannot choose to call tools: "
            "tool_choice 'auto' is not supported on it. Force a call (tool_choice 'required' "
            "or a named function), send tool_choice 'none', or use a model type that parses "
            "tool calls.",
            param="tool_choice",
            code="unsupported_parameter",
        )


async def check_prompt_length(
    limits: RateLimits,
    caller: Caller,
    endpoint: ModelEndpoint,
    model: ModelInfo,
    api: Api,
    payload: dict,
    prompt_bytes: int,
) -> None:
    """Refuse a prompt beyond the model's context before any rate-limit counter moves.

    Only a replica's tokenizer knows a prompt's length, so only a body that may hold one that
    long is measured there (rendered as for generation, nothing generated): a token covers at
    least one byte of what the template renders, and a template's JSON of the tools adds at
    most a byte per byte of the body's, so a prompt of `n` bytes renders to fewer than
    `PROMPT_BYTES_BOUND * n` tokens plus the template's own. A shorter one goes straight on,
    and the replica still checks every prompt it generates for. The refusal counts against
    the caller's request rate as any refused body does (a replica rendered it); a caller with
    no request left this minute gets admission's 429 without a replica's work.
    """
    if PROMPT_BYTES_BOUND * prompt_bytes + model.template_tokens < model.max_model_len:
        return
    if not await limits.has_requests_left(caller, endpoint.name):
        return
    try:
        await endpoint.prompt_tokens(api, payload)
    except ApiError as error:
        if error.status < 500:
            await limits.refuse(caller, endpoint.name)
        raise


async def check_inputs(
    limits: RateLimits,
    caller: Caller,
    endpoint: ModelEndpoint,
    model: ModelInfo,
    size: InputSize,
    payload: dict,
) -> None:
    """Refuse an embedding request beyond its plan's bounds (inputs, and their tokens
    together) or with an input beyond the model's context, before any rate-limit counter
    moves. Texts whose tokens may pass a bound are measured by the replica's tokenizer (as
    `check_prompt_length` measures a prompt), which also refuses an input beyond the context."""
    bounds = limits.plan_limits(caller.plan).on(endpoint.name)
    if size.inputs > bounds.inputs_per_request:
        raise ApiError(
            400,
            f"input has {size.inputs} inputs; your plan allows {bounds.inputs_per_request} in "
            f"one request to {endpoint.name}. Send them in several requests.",
            param="input",
            code="too_many_inputs",
        )
    tokens, context = size.tokens, model.max_model_len
    if size.exact and size.longest > context:
        raise ApiError(
            400,
            f"An input has {size.longest} tokens; this model's maximum context length is "
            f"{context} tokens. Shorten or split the input.",
            param="input",
            code="context_length_exceeded",
        )
    if not size.exact and (tokens > bounds.input_tokens_per_request or size.longest >= context):
        if not await limits.has_requests_left(caller, endpoint.name):
            return  # admission's 429, without a replica's work
        try:
            tokens = await endpoint.prompt_tokens(Api.EMBEDDINGS, payload)
        except ApiError as error:
            if error.status < 500:
                await limits.refuse(caller, endpoint.name)
            raise
    if tokens > bounds.input_tokens_per_request:
        raise ApiError(
            400,
            f"input has {tokens} tokens; your plan allows {bounds.input_tokens_per_request} "
            f"tokens of input in one request to {endpoint.name}. Send fewer or shorter "
            "inputs in each request.",
            param="input",
            code="too_many_input_tokens",
        )
