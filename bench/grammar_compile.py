"""What strict JSON strings cost a grammar's compilation: xgrammar's own compile of a schema
against the same schema through its EBNF with strict strings (deployments/vllm_engine/strict_json.py).

    .venv/bin/python -m bench.grammar_compile [--model DIR] [--rounds 5]

Each sample compiles one schema on a compiler with its cache off (the first request of a
schema; later ones hit vLLM's cache either way), with the model's own tokenizer (default the
tiny test model). Prints the median per schema, in milliseconds, both ways.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import xgrammar as xgr
from transformers import AutoTokenizer

from deployments.vllm_engine.strict_json import StrictStringCompiler

COMPACT = {"any_whitespace": False, "separators": (",", ":")}
SCHEMAS = {
    "plain strings": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["city", "n"],
    },
    "bounded strings": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "code": {"type": "string", "minLength": 2, "maxLength": 8},
        },
        "required": ["city", "code"],
    },
    "nested, bounded": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 20},
                        "tags": {"type": "array", "items": {"type": "string", "minLength": 1}},
                    },
                    "required": ["name"],
                },
            }
        },
        "required": ["items"],
    },
}


def timed(compile_schema, schema: str, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        compile_schema(schema, **COMPACT)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    from deployments.model_type import tiny_model_dir
    from deployments.tiny_model import ensure

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model or ensure(tiny_model_dir()))
    info = xgr.TokenizerInfo.from_huggingface(tokenizer)
    plain = xgr.GrammarCompiler(info, cache_enabled=False)
    strict = StrictStringCompiler(xgr.GrammarCompiler(info, cache_enabled=False))
    print(f"vocabulary {info.vocab_size} tokens; median ms of {args.rounds} compiles")
    print(f"{'schema':18} {'xgrammar':>9} {'strict':>9}")
    for name, schema in SCHEMAS.items():
        text = json.dumps(schema)
        before = timed(plain.compile_json_schema, text, args.rounds)
        after = timed(strict.compile_json_schema, text, args.rounds)
        print(f"{name:18} {before:9.2f} {after:9.2f}")


if __name__ == "__main__":
    main()
