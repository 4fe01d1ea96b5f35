"""Schema grammars hold strict JSON strings: xgrammar's own grammar let a length-bounded string
take raw control characters and no escape at all; the mended one takes exactly the strings a
strict parser reads, each escape one character of the bound. The engine generates through it
for real in tests/e2e/test_strict_json.py."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.vllm_engine.strict_json import StrictStringCompiler, install, strict_strings

COMPACT = {"any_whitespace": False, "separators": (",", ":")}


@pytest.fixture(scope="module")
def compiler() -> StrictStringCompiler:
    return StrictStringCompiler(xgr.GrammarCompiler(xgr.TokenizerInfo([])))


def accepts(compiled, text: str) -> bool:
    """The grammar takes `text` whole: a prefix of a longer text it takes is not enough."""
    matcher = xgr.GrammarMatcher(compiled)
    return matcher.accept_string(text) and matcher.is_completed()


def bounded(**bounds: int) -> str:
    return json.dumps(
        {
            "type": "object",
            "properties": {"v": {"type": "string", **bounds}},
            "required": ["v"],
            "additionalProperties": False,
        }
    )


def test_xgrammar_alone_still_lets_a_bounded_string_hold_a_control_character():
    """The defect this module mends; when an xgrammar upgrade fixes it, this fails: drop the
    mend then."""
    plain = xgr.GrammarCompiler(xgr.TokenizerInfo([]))
    assert accepts(plain.compile_json_schema(bounded(maxLength=3), **COMPACT), '{"v":"\x0f"}')


def test_latin_1_characters_survive_the_grammars_text(compiler):
    """xgrammar prints U+0080-U+00FF as `\\xHH` and reads a hex digit after one as part of
    it: its own text of a grammar with an enum value "éa" reads back as U+0E9A. The mended
    grammar writes them as `\\u00HH`."""
    schema = json.dumps(
        {
            "type": "object",
            "required": ["v", "w"],
            "properties": {
                "v": {"type": "string", "enum": ["éa", "Zürich", "\\xe9"]},
                "w": {"type": "string", "maxLength": 2},
            },
        }
    )
    plain = xgr.GrammarCompiler(xgr.TokenizerInfo([]))
    text = str(xgr.Grammar.from_json_schema(schema, **COMPACT))
    assert not accepts(plain.compile_grammar(text), '{"v":"éa","w":""}')
    compiled = compiler.compile_json_schema(schema, **COMPACT)
    for value in ("éa", "Zürich", "\\xe9"):
        assert accepts(
            compiled, json.dumps({"v": value, "w": "é1"}, ensure_ascii=False, separators=(",", ":"))
        )


@pytest.mark.parametrize(
    "text, ok",
    [
        ('{"v":"abc"}', True),
        ('{"v":"abcd"}', False),
        ('{"v":"a\x0fb"}', False),
        ('{"v":"a\tb"}', False),
        ('{"v":"\\n\\t\\""}', True),
        ('{"v":"\\u00e9"}', True),
        ('{"v":"\\ud83d\\ude00"}', True),  # one code point, as maxLength counts
        ('{"v":"\\ud83d"}', False),  # a lone surrogate decodes to no character
        ('{"v":"\\x"}', False),
    ],
)
def test_a_bounded_string_takes_json_characters_only(compiler, text, ok):
    assert accepts(compiler.compile_json_schema(bounded(maxLength=3), **COMPACT), text) is ok


def accepts_bytes(compiled, data: bytes) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    return matcher.accept_string(data) and matcher.is_completed()


@pytest.mark.parametrize(
    "character, ok",
    [
        ("é".encode(), True),
        ("\ud7ff".encode(), True),  # the last code point before the surrogates
        ("\ue000".encode(), True),  # the first after them
        ("😀".encode(), True),  # four bytes, one character
        (b"\xed\xa0\x80", False),  # U+D800's three bytes: no decoder reads one character
        (b"\xed\xbf\xbf", False),  # U+DFFF's
        (b"\xe0\x80\x80", False),  # an overlong form
        (b"\x80", False),  # a lone continuation byte
    ],
)
def test_a_bounded_string_takes_well_formed_utf_8_only(compiler, character, ok):
    """A byte-level model writes bytes, not characters: a surrogate's three bytes decode to
    three U+FFFD, which took a reply past `maxLength` (`"I,;" + ED A0 80` under maxLength 4)."""
    compiled = compiler.compile_json_schema(bounded(maxLength=4), **COMPACT)
    assert accepts_bytes(compiled, b'{"v":"I,;' + character + b'"}') is ok


def test_xgrammar_alone_still_takes_a_surrogates_bytes_as_a_character():
    """The second defect mended here; when an xgrammar upgrade fixes it, this fails."""
    plain = xgr.GrammarCompiler(xgr.TokenizerInfo([]))
    compiled = plain.compile_json_schema(bounded(maxLength=4), **COMPACT)
    assert accepts_bytes(compiled, b'{"v":"I,;\xed\xa0\x80"}')


def test_structural_tags_of_automatic_calls_are_mended_too(compiler):
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<tool_call>"],
            "tags": [
                {
                    "type": "tag",
                    "begin": "<tool_call>",
                    "end": "</tool_call>",
                    "content": {
                        "type": "json_schema",
                        "json_schema": json.loads(bounded(minLength=1)),
                    },
                }
            ],
        },
    }
    compiled = compiler.compile_structural_tag(json.dumps(tag))
    assert not accepts(compiled, 'hi <tool_call>{"v":"\x01"}</tool_call>')
    assert accepts(compiled, 'hi <tool_call>{"v":"\\u0001"}</tool_call>')


def test_a_grammar_without_bounded_strings_is_left_as_it_is():
    ebnf = str(xgr.Grammar.from_json_schema(json.dumps({"type": "string"}), **COMPACT))
    assert strict_strings(ebnf) == ebnf


@settings(max_examples=150, deadline=None)
@given(value=st.text(max_size=6), low=st.integers(0, 3), extra=st.integers(0, 4))
def test_every_string_a_strict_parser_reads_within_the_bounds_is_taken_and_no_other(
    compiler, value, low, extra
):
    schema = bounded(minLength=low, maxLength=low + extra)
    compiled = compiler.compile_json_schema(schema, **COMPACT)
    fits = low <= len(value) <= low + extra
    assert accepts(compiled, json.dumps({"v": value}, separators=(",", ":"))) is fits
    assert (
        accepts(compiled, json.dumps({"v": value}, ensure_ascii=False, separators=(",", ":")))
        is fits
    )
    raw = '{"v":"' + value + '"}'  # the characters unescaped, as the old grammar let them be
    try:
        read = json.loads(raw)
    except ValueError:
        read = None  # not JSON: a strict parser cannot read it
    if read is None or (list(read) == ["v"] and not low <= len(read["v"]) <= low + extra):
        assert not accepts(compiled, raw)


def test_the_plugin_wraps_every_xgrammar_backend_vllm_builds():
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    install()
    install()  # plugins may load twice in a process
    assert XgrammarBackend.__post_init__._serviceai_strict
    assert XgrammarBackend.__post_init__.__wrapped__.__name__ == "__post_init__"
