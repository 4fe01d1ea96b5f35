"""JSON that a strict parser reads: no raw control character in a length-bounded string.

xgrammar 0.2.8 (vLLM 0.32's) lowers a JSON-schema string with `minLength` or `maxLength` to a
bounded repetition of `[^"\\\r\n]`: no escape sequence at all, and every other character
U+0000-U+001F raw, which RFC 8259 forbids (xgrammar issue 800; its fixes, PRs 822/828/880,
are not released). A random-weight model wrote `{"city":"\x0f\x0f"}` in 10 of 24 replies;
`json.loads`, pydantic and `JSON.parse` refuse it, and vLLM's tool parsers dropped such a
forced call. A real model writes raw tabs and newlines wherever it puts code in a string.

Here the grammar is mended where it starts, in the engine core that compiles it: every JSON
grammar vLLM compiles from a schema (`response_format`, `text.format`, forced calls, the
structural tags of automatic calls) goes through its EBNF, in which each such repetition
matches one JSON character instead: an unescaped one other than U+0000-U+001F, `"` and `\\`,
a short escape, a `\\u` escape of one code point, or a surrogate pair (one code point, as
`maxLength` counts), never a surrogate's bytes, which xgrammar takes as one character and a
decoder as three. A grammar with no such string is compiled by xgrammar as before;
grammars a client writes (`structured_outputs.grammar`, regex) are theirs. Registered as a vLLM general plugin, so it runs in every vLLM process.
"""

from __future__ import annotations

import functools
import re
from typing import Any

BOUNDED_CHARACTER = r"[^\"\\\r\n]"
"""One character of a length-bounded string, as xgrammar 0.2.8 prints it (a rule of its own,
or inline where the bound is 1)."""
JSON_CHARACTER = "serviceai_json_character"
JSON_CHARACTER_RULES = f"""\
{JSON_CHARACTER} ::= [^\\"\\\\\\0-\\x1f\\ud800-\\udfff] | "\\\\" [\\"\\\\/bfnrt] | "\\\\u" serviceai_bmp_code \
| "\\\\u" [dD] [89abAB] serviceai_hex serviceai_hex "\\\\u" [dD] [c-fC-F] serviceai_hex serviceai_hex
serviceai_bmp_code ::= [0-9a-cA-Ce-fE-F] serviceai_hex serviceai_hex serviceai_hex \
| [dD] [0-7] serviceai_hex serviceai_hex
serviceai_hex ::= [0-9a-fA-F]
"""
"""One character of a JSON string as RFC 8259 writes it, a surrogate pair being one. The
unescaped one excludes U+D800-U+DFFF: xgrammar's negated class takes a surrogate's three UTF-8
bytes (ED A0 80 ...) as one character, which no UTF-8 decoder reads as one (vLLM's detokenizer
writes three U+FFFD), so a bounded string could come out three characters longer than its
`maxLength`."""


LATIN_1_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\x([0-9a-fA-F]{2})")
"""`\\xHH` (not an escaped backslash before `x`): xgrammar prints U+0080-U+00FF so, and its
parser reads a hex digit after it as part of the escape ("éa" would come back as U+0E9A)."""


@functools.lru_cache(maxsize=1024)
def strict_strings(ebnf: str) -> str:
    """`ebnf` (xgrammar's print of a grammar) with every length-bounded string's character
    matching one JSON character, in text that xgrammar's parser reads back as it was; as it
    is where it has no such string."""
    if BOUNDED_CHARACTER not in ebnf:
        return ebnf
    mended = LATIN_1_ESCAPE.sub(r"\1\\u00\2", ebnf.replace(BOUNDED_CHARACTER, JSON_CHARACTER))
    return mended.rstrip("\n") + "\n" + JSON_CHARACTER_RULES


class StrictStringCompiler:
    """An xgrammar `GrammarCompiler` whose JSON-schema and structural-tag grammars hold strict
    JSON strings; anything else goes to the compiler as it is."""

    def __init__(self, compiler: Any) -> None:
        self._compiler = compiler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiler, name)

    def compile_json_schema(self, schema: Any, **options: Any) -> Any:
        import xgrammar as xgr

        ebnf = str(xgr.Grammar.from_json_schema(schema, **options))
        if BOUNDED_CHARACTER not in ebnf:
            return self._compiler.compile_json_schema(schema, **options)
        return self._compiler.compile_grammar(strict_strings(ebnf))

    def compile_structural_tag(self, *tag: Any) -> Any:
        """A tag in either of xgrammar's forms: its JSON, or (tags, triggers)."""
        import xgrammar as xgr

        ebnf = str(xgr.Grammar.from_structural_tag(*tag))
        if BOUNDED_CHARACTER not in ebnf:
            return self._compiler.compile_structural_tag(*tag)
        return self._compiler.compile_grammar(strict_strings(ebnf))


def install() -> None:
    """vLLM general plugin: every xgrammar backend vLLM builds in this process compiles schema
    grammars with strict strings."""
    from deployments.vllm_engine.vllm_internals import wrap_xgrammar_compiler

    wrap_xgrammar_compiler("_serviceai_strict", StrictStringCompiler)
