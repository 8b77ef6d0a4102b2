"""Formats that are an explicit list of values: NF4, binary, ternary, or your own."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from lowbit._arrays import as_float64, check_codes
from lowbit.codecs.vectorised import check_nan_policy, prepare_random
from lowbit.enums import Rounding, as_rounding
from lowbit.errors import CodeRangeError, LowbitError, NaNPolicyError
from lowbit.formats.base import Format

__all__ = ["ValueSetFormat", "rounding_bins"]


@dataclass(frozen=True, kw_only=True)
class ValueSetFormat(Format):
    """A format whose code ``i`` means ``table[i]`` (``table`` strictly increasing).

    Rounding picks between the two table entries around a value; ties in the nearest
    modes go to the even code (``nearest_even``) or to the larger magnitude
    (``nearest_away``). Values outside the table saturate to its ends: these formats
    are used with a scale, which is where range comes from.
    """

    name: str
    table: tuple[float, ...]
    description: str = field(default="", compare=False)
    source: str = field(default="", compare=False)

    kind = "valueset"

    def __post_init__(self) -> None:
        t = np.asarray(self.table, dtype=np.float64)
        if t.ndim != 1 or t.size < 2 or not np.all(np.isfinite(t)) or np.any(np.diff(t) <= 0):
            raise LowbitError(
                f"value table of {self.name!r} must be finite and strictly increasing"
            )

    @property
    def bits(self) -> int:
        return max(1, math.ceil(math.log2(len(self.table))))

    @property
    def _t(self) -> np.ndarray:
        return np.asarray(self.table, dtype=np.float64)

    @property
    def max(self) -> float:
        return float(self.table[-1])

    @property
    def min(self) -> float:
        return float(self.table[0])

    @property
    def smallest_positive(self) -> float:
        t = self._t
        return float(t[t > 0].min())

    @property
    def smallest_normal(self) -> float:
        return self.smallest_positive

    @property
    def eps(self) -> float:
        t = self._t
        above = t[t > 1.0]
        return float(above.min() - 1.0) if 1.0 in self.table and above.size else float("nan")

    @property
    def digits(self) -> float:
        return math.log10(len(self.table))

    @property
    def finite_count(self) -> int:
        return len(self.table)

    def values(self) -> np.ndarray:
        return self._t.copy()

    def encode(
        self,
        x: Any,
        *,
        rounding: str = "nearest_even",
        saturate: bool | None = None,
        seed: Any = None,
        random_bits: Any = None,
        nan: str = "raise",
    ) -> np.ndarray:
        """Index of the table entry each value rounds to (values beyond the ends saturate)."""
        mode = as_rounding(rounding)
        check_nan_policy(nan)
        x = as_float64(x)
        t = self._t
        isnan = np.isnan(x)
        if isnan.any():
            if nan == "raise":
                raise NaNPolicyError(f"input contains NaN and {self.name} has no NaN code")
            x = np.where(isnan, 0.0, x)
        xc = np.clip(x, t[0], t[-1])
        hi = np.searchsorted(t, xc, side="left")  # t[hi-1] < xc <= t[hi]
        hi = np.clip(hi, 1, t.size - 1)
        lo = hi - 1
        exact_lo = xc == t[lo]
        exact_hi = xc == t[hi]
        if mode in (Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY):
            side = _nearer(xc, t[lo], t[hi])  # +1: t[hi] is nearer, 0: a tie
            if mode is Rounding.NEAREST_EVEN:
                tie_up = hi % 2 == 0
            else:
                tie_up = np.abs(t[hi]) >= np.abs(t[lo])
            up = (side > 0) | ((side == 0) & tie_up)
        elif mode is Rounding.TOWARD_ZERO:
            # the neighbour nearer zero; in a gap around zero (no 0 in the table, e.g.
            # binary) the one of x's sign, so that the sign is kept
            up = (t[hi] <= 0) | ((t[lo] < 0) & (t[hi] > 0) & (xc > 0))
        elif mode is Rounding.TOWARD_POSITIVE:
            up = np.ones(x.shape, dtype=bool)
        elif mode is Rounding.TOWARD_NEGATIVE:
            up = np.zeros(x.shape, dtype=bool)
        else:
            rb = prepare_random(mode, x.shape, seed, random_bits).reshape(x.shape)
            up = _stochastic_up(xc, t[lo], t[hi], rb)
        up = np.where(exact_lo, False, np.where(exact_hi, True, up))
        return np.where(up, hi, lo).astype(self.code_dtype)

    def decode(self, codes: Any, dtype: Any = np.float32) -> np.ndarray:
        """Table values of the codes."""
        c = check_codes(codes, self.bits, self.name)
        if c.size and int(c.max()) >= len(self.table):
            raise CodeRangeError(
                f"code {int(c.max())} is out of range for {self.name}: codes are 0..{len(self.table) - 1}"
            )
        return self._t.astype(dtype)[c.astype(np.intp)]


def _nearer(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """sign((x - lo) - (hi - x)), exactly: +1 where ``hi`` is nearer, 0 at a tie.

    The two distances are computed in float64, each within half an ulp of the largest
    operand; where they are too close to tell, exact rationals decide.
    """
    diff = (x - lo) - (hi - x)
    side = np.sign(diff).astype(np.int8)
    scale = np.abs(x) + np.abs(lo) + np.abs(hi)
    unsure = np.abs(diff) <= scale * 2.0**-50
    if unsure.any():
        from fractions import Fraction

        flat = side.reshape(-1)
        for i in np.flatnonzero(unsure):
            xi, li, hi_ = (float(a.reshape(-1)[i]) for a in (x, lo, hi))
            d = 2 * Fraction(xi) - Fraction(li) - Fraction(hi_)
            flat[i] = (d > 0) - (d < 0)
    return side


def _stochastic_up(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, rb: np.ndarray) -> np.ndarray:
    """``rb < (x - lo) / (hi - lo) * 2**64``, exactly (lo <= x <= hi elementwise).

    The fraction is computed in float64 (relative error a few ulps, so the threshold is
    within 2**14 of exact); the rare elements whose random bits fall within 2**20 of it
    are decided again with exact rationals.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        approx = np.ldexp((x - lo) / (hi - lo), 64)
    rbf = rb.astype(np.float64)  # within 2**11 of rb
    up = rbf < approx
    unsure = np.abs(rbf - approx) <= 2.0**20
    if unsure.any():
        from fractions import Fraction

        idx = np.flatnonzero(unsure)
        for i, xi, li, hi_, ri in zip(
            idx,
            x.reshape(-1)[idx],
            lo.reshape(-1)[idx],
            hi.reshape(-1)[idx],
            rb.reshape(-1)[idx],
            strict=True,
        ):
            r = (Fraction(float(xi)) - Fraction(float(li))) / (
                Fraction(float(hi_)) - Fraction(float(li))
            )
            up.reshape(-1)[i] = int(ri) < r * 2**64
    return up


@cache
def rounding_bins(
    fmt: ValueSetFormat, min_bins: int = 4096
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float, float]:
    """Bin tables for rounding onto a value set fast, shared by both quantizer paths.

    On a uniform grid of at least ``min_bins`` bins over the table's range (finer where
    neighbouring midpoints are close), the code at each bin's lower edge and whether a
    midpoint lies in the bin or within ``tol`` of it (a "risky" bin, where the caller
    compares with the midpoints or falls back to the exact codec).

    Args:
        fmt: the value set.
        min_bins: the fewest bins (the compiled kernel asks for more).

    Returns:
        ``(base, risky, mids, tol, lo, bins_per_unit)``: uint8 code per bin, bool per bin,
        float64 midpoints, the tolerance, the table's lowest value, bins per unit value.
    """
    t = fmt.values().astype(np.float64)
    mids = (t[:-1] + t[1:]) / 2
    lo, hi = float(t[0]), float(t[-1])
    tol = max(abs(lo), abs(hi)) * 2.0**-20
    nbins = min_bins
    while nbins < (1 << 16) and np.min(np.diff(mids), initial=np.inf) <= 4 * (hi - lo) / nbins:
        nbins *= 2
    edges = lo + (hi - lo) * np.arange(nbins + 1) / nbins
    base = np.searchsorted(mids, edges[:-1], side="left")  # midpoints below each edge
    risky = np.searchsorted(mids, edges[1:] + tol, side="left") > np.searchsorted(
        mids, edges[:-1] - tol, side="left"
    )
    base[-1] = mids.size  # the last bin holds the top value (and everything clipped there)
    return base.astype(np.uint8), risky, mids, tol, lo, nbins / (hi - lo)
