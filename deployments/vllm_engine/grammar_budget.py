"""A time budget on every grammar the engine compiles: past it the request fails, and the
engine's grammar worker takes the next.

vLLM compiles a constrained request's grammar in its engine core, on a pool of (cores + 1) // 2
threads, and holds the request until it is done; xgrammar's compile cannot be interrupted. The
ingress bounds what a request may ask the compiler for (app/limits/structure_bounds.py); this
is the backstop for what those bounds do not count (another tokenizer, a shape they miss). Each
compile runs on a thread of its own, and the pool's worker waits for it at most the budget
(`SERVICEAI_GRAMMAR_COMPILE_BUDGET_S`), then fails the request: vLLM ends it with an error, and
the replica answers 400 `grammar_too_complex` (replies.refused_grammar). The compile goes on to
its end on its own thread, off the engine's loop (xgrammar releases the GIL), and its grammar
lands in the compiler's cache. Registered as a vLLM general plugin, so it runs in every vLLM
process.
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

BUDGET_ENV = "SERVICEAI_GRAMMAR_COMPILE_BUDGET_S"
DEFAULT_BUDGET_S = 10.0
"""At the ingress's bounds xgrammar compiled each kind in under a second on one core, with a
132,000-token vocabulary (bench/NOTES.md): ten times that, for a busy engine."""


def budget_s() -> float:
    return float(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET_S))


class GrammarBudgetExceeded(ValueError):
    """A compile that outlived its budget (a ValueError: vLLM's own regex timeout raises one)."""


class BudgetedCompiler:
    """An xgrammar `GrammarCompiler` whose `compile_*` calls each return within `budget`
    seconds or raise GrammarBudgetExceeded; anything else goes to the compiler as it is."""

    def __init__(self, compiler: Any, budget: float) -> None:
        self._compiler = compiler
        self.budget = budget

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._compiler, name)
        if name.startswith("compile_") and callable(attribute):
            return functools.partial(self._within_budget, attribute)
        return attribute

    def _within_budget(self, compile: Any, *args: Any, **kwargs: Any) -> Any:
        result: Future[Any] = Future()

        def run() -> None:
            try:
                result.set_result(compile(*args, **kwargs))
            except BaseException as exc:  # handed to the waiting worker, raised there
                result.set_exception(exc)

        threading.Thread(target=run, name="grammar-compile", daemon=True).start()
        try:
            return result.result(timeout=self.budget)
        except FutureTimeout:
            raise GrammarBudgetExceeded(
                f"compiling the grammar took longer than its budget of {self.budget:g} s"
            ) from None


def install() -> None:
    """vLLM general plugin: every xgrammar backend vLLM builds in this process compiles within
    the budget."""
    from deployments.vllm_engine.vllm_internals import wrap_xgrammar_compiler

    wrap_xgrammar_compiler(
        "_serviceai_budget", lambda compiler: BudgetedCompiler(compiler, budget_s())
    )
