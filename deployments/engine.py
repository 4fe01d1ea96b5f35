"""The adapter around vLLM's AsyncLLM: chat messages in, token deltas out.

The only module that imports vLLM. It renders the chat template, checks the context window,
maps our sampling options onto vLLM's, and turns vLLM's outputs and errors into the plain
types of `deployments.generation`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind
from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from deployments.generation import (
    ContextLengthExceeded,
    Delta,
    EngineUnavailable,
    GenerationChunk,
    GenerationRequest,
    InvalidGenerationRequest,
    SamplingOptions,
)

logger = logging.getLogger(__name__)

# Rendering a long conversation blocks the event loop that streams every other request of
# this replica; past this size it runs in a worker thread (vLLM's tokenizer is thread-safe).
_INLINE_RENDER_CHARS = 8192


class VllmEngine:
    """One vLLM engine serving one model type."""

    def __init__(self, engine: AsyncLLM) -> None:
        self._engine = engine
        self._tokenizer = engine.get_tokenizer()
        self.max_model_len: int = engine.model_config.max_model_len

    @classmethod
    def start(cls, engine_kwargs: dict[str, Any]) -> VllmEngine:
        """Build the engine; blocks until the model is loaded and the engine core is up.

        vLLM's engine metrics (vllm:*) go out through Ray's metrics API, beside the ingress's.
        """
        args = AsyncEngineArgs(**engine_kwargs)
        return cls(AsyncLLM.from_engine_args(args, stat_loggers=[RayPrometheusStatLogger]))

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Yield the reply as it is generated; closing the iterator aborts the engine request."""
        prompt_ids = await self._render(request.messages)
        params = self._sampling_params(request.sampling, len(prompt_ids), RequestOutputKind.DELTA)
        prompt_tokens = len(prompt_ids)
        async for output in self._generate(prompt_ids, params, request.request_id):
            yield GenerationChunk(
                prompt_tokens,
                tuple(
                    Delta(o.index, o.text, len(o.token_ids), _finish_reason(o.finish_reason))
                    for o in output.outputs
                ),
            )

    async def complete(self, request: GenerationRequest) -> GenerationChunk:
        """Generate the whole reply and return it as one chunk, one delta per choice."""
        prompt_ids = await self._render(request.messages)
        params = self._sampling_params(
            request.sampling, len(prompt_ids), RequestOutputKind.FINAL_ONLY
        )
        final = None
        async for output in self._generate(prompt_ids, params, request.request_id):
            final = output
        if final is None:
            raise EngineUnavailable("The engine ended the request without a result.")
        return GenerationChunk(
            len(prompt_ids),
            tuple(
                Delta(o.index, o.text, len(o.token_ids), _finish_reason(o.finish_reason))
                for o in sorted(final.outputs, key=lambda o: o.index)
            ),
        )

    async def check_health(self) -> None:
        """Raise if the engine core is dead, so that Serve replaces this replica."""
        await self._engine.check_health()

    def running_requests(self) -> int:
        return self._engine.output_processor.get_num_unfinished_requests()

    def shutdown(self) -> None:
        self._engine.shutdown()

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[Any]:
        try:
            async for output in self._engine.generate(
                {"prompt_token_ids": prompt_ids}, params, request_id
            ):
                yield output
        except VLLMValidationError as exc:
            raise InvalidGenerationRequest(exc.args[0] if exc.args else "Invalid request.") from None
        except EngineDeadError:
            raise EngineUnavailable(
                "The model engine stopped; the request was not completed. Retry shortly."
            ) from None
        except EngineGenerateError:
            raise EngineUnavailable("The model engine failed this request. Retry shortly.") from None

    async def _render(self, messages: tuple[tuple[str, str], ...]) -> list[int]:
        conversation = [{"role": role, "content": content} for role, content in messages]
        if sum(len(content) for _, content in messages) <= _INLINE_RENDER_CHARS:
            return self._render_sync(conversation)
        return await asyncio.to_thread(self._render_sync, conversation)

    def _render_sync(self, conversation: list[dict[str, str]]) -> list[int]:
        text = self._tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
        # The template carries any special tokens itself; adding them again would double BOS.
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _sampling_params(
        self, options: SamplingOptions, prompt_tokens: int, kind: RequestOutputKind
    ) -> SamplingParams:
        room = self.max_model_len - prompt_tokens
        if room <= 0 or (options.max_tokens is not None and options.max_tokens > room):
            requested = (
                f" However, you requested {prompt_tokens + options.max_tokens} tokens "
                f"({prompt_tokens} in the messages, {options.max_tokens} in the completion)."
                if options.max_tokens is not None
                else f" However, your messages resulted in {prompt_tokens} tokens."
            )
            raise ContextLengthExceeded(
                f"This model's maximum context length is {self.max_model_len} tokens."
                f"{requested} Please reduce the length of the messages or completion."
            )
        return SamplingParams(
            n=options.n,
            max_tokens=options.max_tokens if options.max_tokens is not None else room,
            temperature=options.temperature,
            top_p=options.top_p,
            frequency_penalty=options.frequency_penalty,
            presence_penalty=options.presence_penalty,
            stop=list(options.stop) or None,
            seed=options.seed,
            ignore_eos=options.ignore_eos,
            min_tokens=options.min_tokens,
            output_kind=kind,
        )


def _finish_reason(reason: str | None) -> str | None:
    """vLLM says 'abort' when we cancelled; the client never sees that request again."""
    if reason is None or reason in ("stop", "length"):
        return reason
    if reason == "error":
        raise EngineUnavailable("The model engine failed while generating. Retry shortly.")
    return "stop"
