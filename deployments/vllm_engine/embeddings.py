"""/v1/embeddings on vLLM's own pooling serving layer (`ServingEmbedding`), a `ServedApi`.

vLLM's handler tokenizes each input (text or token ids), refuses one beyond the model's context
or a `dimensions` the model was not trained for, runs every input as an engine request of its
own and encodes the vectors (floats, or base64 of float32) with their usage. Only OpenAI's form
is served: a list of strings or of token ids (the ingress refuses vLLM's chat-shaped inputs).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from fastapi.responses import Response
from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.renderers.inputs.preprocess import extract_prompt_len

from deployments.vllm_engine.replies import Event


class EmbeddingsApi:
    """POST /v1/embeddings on vLLM's embedding handler: always a whole reply."""

    request_type = EmbeddingCompletionRequest
    prompt_param = "input"

    def __init__(self, serving: ServingEmbedding) -> None:
        self._serving = serving

    def create(self, request: EmbeddingCompletionRequest) -> Any:
        return self._serving(request)

    def create_error_response(self, error: Exception) -> ErrorResponse:
        """vLLM's refusal, naming the field: `dimensions` the model was not trained for, else
        an input (empty, beyond the context, a token id beyond the vocabulary)."""
        response = self._serving.create_error_response(error)
        if response.error.param is None:
            dimensions = "atryoshka" in response.error.message
            response.error.param = "dimensions" if dimensions else "input"
        return response

    def schema_param(self, body: dict[str, Any]) -> str:
        return "input"

    def body(self, result: Response, request: EmbeddingCompletionRequest) -> bytes:
        return bytes(result.body)

    def events(self, stream: Any, request: Any) -> AsyncGenerator[Event, None]:
        raise TypeError("/v1/embeddings has no stream")

    async def prompt_tokens(self, request: EmbeddingCompletionRequest) -> int:
        """Every input's tokens together, as the handler renders them for the engine (the
        ingress holds a request to its plan's input tokens); an input beyond the context is
        refused as encoding would refuse it."""
        serving = self._serving
        io_processor = serving.get_io_processor(request)
        context = await serving._init_ctx(io_processor, request)
        await serving._preprocessing(io_processor, context)
        config = serving.model_config
        return sum(extract_prompt_len(config, i["prompts"]) for i in context.engine_inputs)
