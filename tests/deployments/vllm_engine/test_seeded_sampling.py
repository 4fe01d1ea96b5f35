"""A seeded request's CPU generator undoes a discarded step's draw, as vLLM's rewind asks.

The engine itself runs the patch in tests/e2e/test_engine_survival.py (concurrent seeded
requests with fresh long prompts); here, the generator and the plugin's hooks.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import torch
from vllm.v1.worker.gpu_input_batch import CachedRequestState
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from deployments.vllm_engine.seeded_sampling import RewindableGenerator, install, rewindable


def draw(generator: torch.Generator) -> int:
    """One draw as vLLM's CPU sampler makes it for a seeded request, once per step."""
    return int(torch.randint(0, 2**31, (1,), generator=generator).item())


def test_the_rewind_vllm_makes_for_a_discarded_step_restores_the_step_start():
    generator = rewindable(torch.Generator().manual_seed(7))
    first = draw(generator)
    generator.mark()  # a sampling step begins
    second = draw(generator)
    generator.set_offset(generator.get_offset() - 4)  # vLLM's rewind of a partial prefill
    assert draw(generator) == second
    assert first != second


def test_a_converted_generator_continues_where_the_original_was():
    original = torch.Generator().manual_seed(42)
    draw(original)
    expected = draw(torch.Generator().manual_seed(42).set_state(original.get_state()))
    converted = rewindable(original)
    assert isinstance(converted, RewindableGenerator)
    assert draw(converted) == expected
    assert rewindable(None) is None


def test_the_plugin_is_registered_and_installs_its_hooks_once():
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins["serviceai_seeded_sampling"] == "deployments.vllm_engine.seeded_sampling:install"
    install()
    patched = GPUModelRunner._sample
    install()  # vLLM may load plugins more than once in a process
    assert GPUModelRunner._sample is patched
    state = CachedRequestState(
        req_id="r",
        prompt_token_ids=[1, 2],
        mm_features=[],
        sampling_params=None,
        generator=torch.Generator().manual_seed(3),
        block_ids=([],),
        num_computed_tokens=0,
        output_token_ids=[],
    )
    assert isinstance(state.generator, RewindableGenerator)
