"""Seeded sampling on vLLM's CPU build: a chunked prefill undoes its draw as on a GPU.

When a step prefills only part of a prompt, vLLM samples a token for the request anyway,
discards it, and rewinds the request's generator so that a `seed` gives the same reply however
the prompt was chunked: `gen.set_offset(gen.get_offset() - 4)` in
`GPUModelRunner._bookkeeping_sync` (vLLM 0.32), Philox arithmetic that only a CUDA generator
has. A CPU `torch.Generator` raises "CPU Generator does not use offset", and the engine core
dies with every request it holds: any client could take an engine down with `seed` and a long
prompt. Here a seeded request's CPU generator remembers its state before each sampling step,
and vLLM's offset rewind restores that state. The CUDA path is untouched.

Registered as a vLLM general plugin (pyproject.toml), so it is installed in every vLLM process,
the engine's workers included, before any request.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


class RewindableGenerator(torch.Generator):
    """A CPU generator whose offset rewind (vLLM's only use of offsets) restores the state it
    had at the last `mark`, the start of the sampling step."""

    def mark(self) -> None:
        self._before_step = self.get_state()

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:  # type: ignore[override]  # torch's returns self
        self.set_state(self._before_step)


def rewindable(generator: torch.Generator | None) -> torch.Generator | None:
    """`generator` as a RewindableGenerator in the same state, where it is a CPU one."""
    if type(generator) is not torch.Generator or generator.device.type != "cpu":
        return generator
    copy = RewindableGenerator()
    copy.set_state(generator.get_state())
    copy.mark()
    return copy


def install() -> None:
    """vLLM general plugin: on the CPU platform, make seeded requests' generators rewindable
    and mark them before every sampling step."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.gpu_input_batch import CachedRequestState
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner._sample, "_serviceai_marks", False):
        return  # plugins may load more than once in a process
    state_init = CachedRequestState.__post_init__
    sample = GPUModelRunner._sample

    @functools.wraps(state_init)
    def post_init(self: CachedRequestState) -> None:
        state_init(self)
        self.generator = rewindable(self.generator)

    @functools.wraps(sample)
    def marked_sample(self: GPUModelRunner, *args: Any, **kwargs: Any) -> Any:
        for generator in self.input_batch.generators.values():
            if isinstance(generator, RewindableGenerator):
                generator.mark()
        return sample(self, *args, **kwargs)

    marked_sample._serviceai_marks = True  # type: ignore[attr-defined]
    CachedRequestState.__post_init__ = post_init  # type: ignore[method-assign]
    GPUModelRunner._sample = marked_sample  # type: ignore[method-assign]
