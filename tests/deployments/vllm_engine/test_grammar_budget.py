"""Each grammar compile returns within its budget: past it the request fails, the worker that
waited is free, and other compiles go on. Real xgrammar, with a vocabulary the size of a real
model's (compile time grows with it); the engine refuses through it in
tests/e2e/test_separate_model_apps.py."""

from __future__ import annotations

import json
import random
import string
import threading

import pytest
import xgrammar as xgr

from deployments.vllm_engine.grammar_budget import BudgetedCompiler, GrammarBudgetExceeded, install

ENUM_BOMB = {
    "type": "object",
    "properties": {"c": {"type": "string", "enum": [f"value {i}" for i in range(5000)]}},
    "required": ["c"],
}
SMALL = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def large_vocabulary() -> xgr.TokenizerInfo:
    """132,000 tokens, as Qwen's and Llama 3's: byte tokens and random pieces."""
    pieces = random.Random(0)
    vocab = [bytes([i]).decode("latin-1") for i in range(256)]
    alphabet = string.ascii_letters + string.digits + ' _{}":,'
    while len(vocab) < 132_000:
        vocab.append("".join(pieces.choices(alphabet, k=pieces.randint(2, 8))))
    return xgr.TokenizerInfo(list(dict.fromkeys(vocab)), vocab_type=xgr.VocabType.RAW)


def compiler(vocabulary: xgr.TokenizerInfo, budget: float) -> BudgetedCompiler:
    plain = xgr.GrammarCompiler(vocabulary, max_threads=1, cache_enabled=False)
    return BudgetedCompiler(plain, budget)


def compiling() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "grammar-compile" and t.is_alive()]


def test_a_compile_past_its_budget_fails_while_it_still_runs(large_vocabulary):
    budgeted = compiler(large_vocabulary, budget=0.01)

    with pytest.raises(GrammarBudgetExceeded, match="budget of 0.01 s"):
        budgeted.compile_json_schema(json.dumps(ENUM_BOMB))

    # The waiting worker was let go before xgrammar was done: the compile goes on alone.
    assert compiling()


def test_other_compiles_go_on_while_one_runs_past_its_budget(large_vocabulary):
    slow = compiler(large_vocabulary, budget=0.01)
    quick = compiler(large_vocabulary, budget=30)

    with pytest.raises(GrammarBudgetExceeded):
        slow.compile_json_schema(json.dumps(ENUM_BOMB))
    compiled = quick.compile_json_schema(json.dumps(SMALL))

    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.accept_string('{"a": 12}') and matcher.is_completed()


def test_a_compile_within_its_budget_returns_the_compilers_grammar():
    budgeted = BudgetedCompiler(xgr.GrammarCompiler(xgr.TokenizerInfo([])), budget=30)

    compiled = budgeted.compile_regex(r"[a-c]{2}")

    assert xgr.GrammarMatcher(compiled).accept_string("ab")
    assert budgeted.budget == 30
    assert budgeted.get_cache_size_bytes() >= 0  # the rest goes to the compiler as it is


def test_a_grammar_the_compiler_refuses_is_its_own_error_not_the_budgets():
    budgeted = BudgetedCompiler(xgr.GrammarCompiler(xgr.TokenizerInfo([])), budget=30)

    with pytest.raises(Exception) as refused:
        budgeted.compile_json_schema("{not json")

    assert not isinstance(refused.value, GrammarBudgetExceeded)


def test_every_xgrammar_backend_compiles_within_the_budget():
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    install()
    install()  # plugins may load twice in a process
    assert XgrammarBackend.__post_init__._serviceai_budget
