"""What the classic overflow and underflow cases become in each 16- and 8-bit format.

Each case is an exact result (10,000 × 10,000 = 1e8, a gradient of 1e-8, ...) rounded
once into every format, as the hardware would store it; the outcome is the value, or
``inf``, ``NaN``, ``saturated`` (clamped to ±max), ``underflow`` (flushed to zero) or
``lost`` (an update that rounds back to where it started). No torch needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.formats.base import Format
from lowbit.formats.catalog import FORMATS
from lowbit.formats.catalog import format as get_format


@dataclass(frozen=True)
class Case:
    """One computation: a label, the expression, its exact result, and what it stands for."""

    label: str
    expr: str
    value: float
    why: str
    start: float | None = None  # for updates: the value before (an update that is lost)


CASES: tuple[Case, ...] = (
    Case("1e4*1e4", "10000 * 10000", 1e8, "a product of two large activations"),
    Case("65504+1", "65504 + 1", 65505.0, "FP16's max plus one: rounds back to max"),
    Case("65504+16", "65504 + 16", 65520.0, "halfway to the next binade: FP16 gives inf"),
    Case("exp(12)", "exp(12)", float(Fraction(math.exp(12))), "an unnormalised softmax logit"),
    Case("448+32", "448 + 32", 480.0, "E4M3's max plus one step"),
    Case("300*300", "300 * 300", 90000.0, "a sum of squares"),
    Case("grad 1e-8", "1e-8", 1e-8, "a small gradient: underflows in FP16"),
    Case("lr*grad", "1e-3 * 3e-6", 3e-9, "an update to a weight (before it is added)"),
    Case("1+1e-3", "1 + 0.001", 1.001, "a weight of 1 plus an update", start=1.0),
    Case("-1e-9", "-1e-9", -1e-9, "a tiny negative value: -0 or +0?"),
)


def demo_formats() -> list[Format]:
    """Every catalog format of 16 or 8 bits (catalog order)."""
    return [f for f in FORMATS.values() if f.bits in (16, 8)]


def outcome(fmt: Format, case: Case, *, saturate: bool = False) -> dict[str, Any]:
    """What ``case.value`` becomes in ``fmt``: ``{"value": float|None, "outcome": str}``.

    Outcomes: ``exact``, ``rounded``, ``inf``, ``NaN``, ``saturated``, ``underflow``,
    ``lost`` (for an update: the result rounds to the starting value), ``no code`` (the
    format refuses the input, e.g. a negative value for an unsigned format without NaN).
    """
    x = np.array([case.value], dtype=np.float64)
    try:
        # saturate=None is each format's default (integers clamp rather than wrap)
        codes = fmt.encode(x, saturate=True if saturate else None)
    except LowbitError:
        return {"value": None, "outcome": "no code"}
    v = float(fmt.decode(codes, dtype=np.float64)[0])
    if math.isnan(v):
        kind = "NaN"
    elif math.isinf(v):
        kind = "inf"
    elif v == 0 and case.value != 0:
        kind = "underflow"
    elif abs(v) == fmt.max and _past_max(fmt, abs(case.value)):
        kind = "saturated"
    elif case.start is not None and v == float(fmt.round(case.start)):
        kind = "lost"
    elif v == case.value:
        kind = "exact"
    else:
        kind = "rounded"
    return {"value": v, "outcome": kind}


def overflow_table(
    formats: list[str | Format] | None = None, *, saturate: bool = False
) -> dict[str, Any]:
    """Every case in every format: a JSON-able dict ``{"cases": [...], "formats": [...]}``.

    Args:
        formats: names or Formats (default: every 16- and 8-bit catalog format).
        saturate: use saturating conversion (OCP OFP8 "SAT" mode) instead of each format's
            default (inf where it has one, else NaN, else ±max).
    """
    fmts = [get_format(f) for f in formats] if formats else demo_formats()
    return {
        "saturate": saturate,
        "cases": [
            {"label": c.label, "expr": c.expr, "exact": c.value, "why": c.why} for c in CASES
        ],
        "formats": [
            {
                "name": f.name,
                "bits": f.bits,
                "max": f.max,
                "results": [outcome(f, c, saturate=saturate) for c in CASES],
            }
            for f in fmts
        ],
    }


def _past_max(fmt: Format, a: float) -> bool:
    """Whether rounding ``a`` to nearest (ties to even) would land above ``fmt.max``."""
    v = fmt.values()
    top, gap = float(v[-1]), float(v[-1] - v[-2])
    edge = top + gap / 2
    if a != edge:
        return a > edge
    top_code = int(fmt.encode(np.array([top]))[0])
    return top_code % 2 == 1  # a tie goes to the even neighbour: above max iff max's code is odd
