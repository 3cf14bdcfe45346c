"""A schema pattern's counted repetitions written out (pipeline/structured.py, ``pattern_size``): the bound
that keeps a grammar compile short must read ``{n}`` as n, not as unbounded (issue 29: ``^[0-9]{6}$`` and a
Chinese ID number were 400s)."""

from __future__ import annotations

import pytest

from hyocr.errors import InvalidRequest
from hyocr.pipeline import structured
from hyocr.pipeline.structured import MAX_PATTERN_REPEAT, pattern_size

SIX_DIGITS = "^[0-9]{6}$"
CHINESE_ID = r"^\d{17}[\dX]$"


@pytest.mark.parametrize(("pattern", "size"), [
    ("a{6}", 6),  # exactly n
    ("a{6,}", 6),  # at least m: m items and a loop
    ("a{2,5}", 5),  # at most n
    ("a{,5}", 5),
    ("a{ 3 }", 3),  # counted even where an engine reads it as text: never under-count
    ("a{0}", 1),
    (SIX_DIGITS, 6),  # anchors match no character
    (CHINESE_ID, 18),
    ("(ab){3}", 6),  # a group's items repeat
    ("((a{2}){3}){4}", 24),  # nested counts multiply
    ("(a|bc){2}", 6),  # every alternative is in the grammar
    ("(?:ab)+c*d?", 5),  # *, + and ? add nothing (the group flag's ":" is over-counted: one item)
    (r"\{3\}", 3),  # escaped braces are literals
    (r"a\{1000}", 7),
    (r"\\{3}", 3),  # an escaped backslash, repeated
    ("[{]{2}", 2),  # a brace in a class is a literal; the class is one item
    ("[a{1000}]", 1),
    ("[]a]{4}", 4),  # "]" first in a class is a literal
    ("[^]a]{4}", 4),
    (r"[\]{]{3}", 3),
    ("a{x}", 4),  # a brace that starts no count is a literal
    ("a{", 2),
    ("a{1000", 6),
    ("a{,}", 4),
    ("{5}a", 1),  # nothing to repeat
])
def test_the_size_of_a_pattern_written_out(pattern, size):
    assert pattern_size(pattern) == size


@pytest.mark.parametrize("pattern", [
    "x{1001}", "^x{5000}$", "x{1001,}", "x{0,1001}", "x{,100000}", "(x{100}){11}", "((x{10}){10}){11}",
    "(ab){501}", "a{99999999999999999999}", "a{1000}{1000}", "(a{5000}",
])
def test_oversized_patterns_are_past_the_bound(pattern):
    assert pattern_size(pattern) > MAX_PATTERN_REPEAT


@pytest.mark.parametrize("pattern", [SIX_DIGITS, CHINESE_ID, "^[A-Z]{2}-\\d{4,}$", "^(\\d{3}-){2}\\d{4}$",
                                     "^x{1000}$", "^[0-9]{6}(-[0-9]{4})?$"])
def test_exact_and_open_counts_are_accepted_in_a_schema(pattern):
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": pattern}}}
    assert structured.from_schema(schema).json_schema is not None
    assert structured.from_schema({"type": "object", "patternProperties": {pattern: {"type": "string"}}})


@pytest.mark.parametrize("pattern", ["^[0-9]{1001}$", "^(\\d{100}){11}$", "^a{2000,}$"])
def test_oversized_patterns_are_still_400s(pattern):
    with pytest.raises(InvalidRequest) as info:
        structured.from_schema({"type": "string", "pattern": pattern})
    assert info.value.code == "invalid_schema" and "add up to at most 1000" in info.value.message
