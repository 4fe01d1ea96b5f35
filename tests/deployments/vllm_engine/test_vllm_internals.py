"""vLLM's internals are fenced: every patch in the adapter is listed, and a vLLM that moved one
fails at the replica's start naming it (the pinned one passes)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from deployments.vllm_engine import vllm_internals
from deployments.vllm_engine.vllm_internals import PATCHED, READ, Surface, check

FOLDER = Path(vllm_internals.__file__).parent


def test_the_pinned_vllm_has_every_surface_listed():
    check()


@pytest.mark.parametrize(
    ("surface", "named"),
    [
        (
            Surface("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._gone", "seeded_sampling"),
            "GPUModelRunner._gone is gone",
        ),
        (
            Surface("vllm.renderers.online_renderer", "OnlineRenderer", "responses", ("moved",)),
            "no longer takes moved",
        ),
        (Surface("vllm.nowhere", "Thing", "engine"), "cannot be imported"),
    ],
)
def test_a_vllm_that_moved_a_surface_fails_naming_it_and_its_user(surface, named):
    with pytest.raises(RuntimeError) as error:
        check((surface,))
    assert named in str(error.value)
    assert f"deployments/vllm_engine/{surface.user}.py needs" in str(error.value)


def patched_in(path: Path) -> set[str]:
    """`Class.attribute` for every assignment to an attribute of a name imported from vLLM."""
    tree = ast.parse(path.read_text())
    from_vllm = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm")
        for alias in node.names
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in from_vllm
                ):
                    found.add(f"{target.value.id}.{target.attr}")
    return found


def test_every_patch_of_vllm_in_the_adapter_is_listed():
    patched = set().union(*(patched_in(path) for path in FOLDER.glob("*.py")))
    assert len(patched) >= 4 and patched <= {surface.path for surface in PATCHED}


def test_every_listed_surface_names_a_module_of_the_adapter():
    for surface in PATCHED + READ:
        assert (FOLDER / f"{surface.user.split(':')[0]}.py").exists(), surface
