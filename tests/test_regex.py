"""lowbit._regex: patterns from files match exactly as ``re`` does on the checked subset, in
time linear in the name, and constructs outside the subset are one LowbitError."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit._regex import MAX_PATTERN, compile_bounded
from lowbit.errors import LowbitError

_ATOMS = ["a", "b", ".", r"\.", r"\d", r"\w", r"\s", "[ab]", "[^a]", "[a-c_]", "0", "\n", "_"]
_QUANTS = ["", "", "*", "+", "?", "{2}", "{1,3}", "{,2}", "{2,}", "*?", "+?"]


@st.composite
def patterns(draw: st.DrawFn, depth: int = 2) -> str:
    """Random patterns of the subset: atoms, groups, alternation, quantifiers, anchors."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        if depth > 0 and draw(st.booleans()):
            inner = "|".join(draw(st.lists(patterns(depth - 1), min_size=1, max_size=3)))
            atom = draw(st.sampled_from(["(", "(?:", "(?P<g>"])) + inner + ")"
            if "(?P<g>" in inner:
                atom = "(" + inner + ")"
        else:
            atom = draw(st.sampled_from(_ATOMS))
        parts.append(atom + draw(st.sampled_from(_QUANTS)))
    body = "".join(parts)
    if draw(st.booleans()):
        body = draw(st.sampled_from(["^", r"\A", ""])) + body
    if draw(st.booleans()):
        body += draw(st.sampled_from(["$", r"\Z", ""]))
    return body


names = st.text(alphabet="ab._0 9\nxé", max_size=12)


@settings(max_examples=300, deadline=None)
@given(patterns(), names)
def test_matches_like_re(pattern: str, name: str) -> None:
    """match/fullmatch agree with re.match/re.fullmatch on every pattern of the subset."""
    try:
        rx = re.compile(pattern)
    except re.error:
        with pytest.raises(LowbitError):
            compile_bounded(pattern)
        return
    ours = compile_bounded(pattern)
    assert ours.match(name) == bool(rx.match(name)), (pattern, name)
    assert ours.fullmatch(name) == bool(rx.fullmatch(name)), (pattern, name)


@pytest.mark.parametrize(
    ("pattern", "name", "full", "want"),
    [
        (r".*\.q_proj$", "model.layers.0.self_attn.q_proj", False, True),
        (r".*self_attn.(k|q|o|v)_proj$", "model.layers.3.self_attn.v_proj", False, True),
        (r"model\.layers\.\d+\.mlp\..*", "model.layers.12.mlp.up_proj.weight", True, True),
        (r"lm_head", "lm_head.weight", False, True),
        (r"lm_head", "lm_head.weight", True, False),
        ("a$", "a\n", False, True),
        ("a$\n", "a\n", True, True),
        ("a\\Z", "a\n", False, False),
        ("x{", "x{", True, True),
        ("[]a]+", "]a]", True, True),
    ],
)
def test_golden(pattern: str, name: str, full: bool, want: bool) -> None:
    """Real compressed-tensors targets and re's corner cases."""
    rx = compile_bounded(pattern)
    assert (rx.fullmatch(name) if full else rx.match(name)) is want
    assert bool(re.fullmatch(pattern, name) if full else re.match(pattern, name)) is want


@pytest.mark.parametrize(
    "pattern",
    [
        "(.*.*)*z",
        "(a+)+$",
        "(a|a)*b",
        "(a|aa)*c",
        ".*.*.*.*.*.*.*.*.*.*z",
        "(x+x+)+y",
        "(\\w+\\s?)*$",
    ],
)
def test_catastrophic_patterns_are_linear(pattern: str) -> None:
    """Patterns that make re backtrack for hours answer in milliseconds on long names."""
    rx = compile_bounded(pattern)
    name = "a" * 5000 + "!"
    t0 = time.perf_counter()
    for _ in range(20):
        rx.match(name)
        rx.fullmatch(name)
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a)\1", "not supported"),
        (r"(?=a)a", "not supported"),
        (r"(?<!a)b", "not supported"),
        (r"(?i)a", "not supported"),
        (r"(?(1)a|b)", "not supported"),
        (r"\bword", "not supported"),
        ("a" * (MAX_PATTERN + 1), "at most"),
        ("(a{1000}){1000}", "states"),
        ("(", "missing"),
        ("a**", "multiple repeat"),
        ("(?P<g>a)(?P<g>b)", "twice"),
    ],
)
def test_outside_the_subset(pattern: str, why: str) -> None:
    """Back-references, look-arounds, flags, word boundaries, huge patterns: one LowbitError."""
    with pytest.raises(LowbitError, match=why):
        compile_bounded(pattern, "plan.yaml: rules[0].regex")
