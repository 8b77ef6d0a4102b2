"""The exact reference codecs: scalar, slow and obviously right.

Every quantity here is an ``int`` or a :class:`fractions.Fraction`; nothing rounds except
the one rounding decision each function documents. The fast numpy codecs
(:mod:`lowbit.codecs.vectorised`, :class:`~lowbit.IntFormat`, :class:`~lowbit.ValueSetFormat`) are
tested bit for bit against these functions, so this module re-derives everything it needs
(the meaning of each code, the special codes, the largest finite code) from a format's
declared layout instead of asking the format for it.

Semantics (IEEE 754-2019 §4.3 rounding-direction attributes and §7.4 overflow, the OCP
OFP8 v1.0 and OCP MX v1.0 conversion rules, and lowbit's documented choices in
``docs/formats.md``):

- **Rounding** is from the input's exact value, once. The magnitude codes of a float
  format are monotone: ``v(0) < v(1) < ... < v(maxc)``; ``v(maxc + 1)``, by the same field
  formula, is where the grid would continue with an unbounded exponent (IEEE 754 §7.4
  decides overflow against it). A value strictly between ``v(k)`` and ``v(k+1)`` rounds
  to one of them: *nearest_even* breaks ties towards the neighbour whose value is an even
  multiple of the gap ``v(k+1) - v(k)`` (the even significand; with no mantissa bits
  both neighbours are odd and the larger one wins, as IEEE 754 does for one-digit
  significands), *nearest_away* towards the larger magnitude, the directed modes by the
  sign of ``x``, and *stochastic* up iff ``random_bits < r * 2**64`` where
  ``r = (|x| - v(k)) / (v(k+1) - v(k))`` exactly.
- **Overflow** (a result past ``v(maxc)``; an infinite input always counts): with
  ``saturate`` the result is ±max. Otherwise rounding toward zero (and toward the
  opposite infinity) gives ±max for finite input (IEEE 754 §7.4), and every other case
  gives ±inf where the format has infinities, else NaN where it has a NaN (keeping the
  sign where the NaN code has one, as ml_dtypes does), else ±max.
- **Below the smallest magnitude** of a format with no zero (OCP MX E8M0): every
  magnitude rounds to the smallest value, in every mode (there is nothing below it).
- **Sign**: -0 stays -0 where the format has one, else +0 (the "fnuz" formats). In an
  unsigned format a negative input that rounds to zero gives +0; any other negative has
  no code: NaN where the format has one, the smallest value under ``saturate``, and an
  error for an unsigned format with neither (the codec refuses every negative input
  there, so this reference does too).
- **NaN** input gives the format's quiet NaN code with the input's sign where the NaN
  code carries one (IEEE and OCP E4M3-style NaNs; payloads are not carried), the single
  NaN code otherwise; formats without a NaN raise :class:`~lowbit.NaNPolicyError`
  unless ``nan="zero"``, which writes code 0 (+0).

Integer formats round to an integer in the same modes, then saturate to [min, max]
(default) or wrap modulo ``2**bits`` (``saturate=False``, what a C cast and ml_dtypes
do). Value-set formats round between the two table entries around ``x`` (ties to the
even code, or to the larger magnitude) and clamp to the table's ends.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cache, lru_cache

import numpy as np

from lowbit.enums import Inf, NaN, Rounding, as_rounding
from lowbit.errors import CodeRangeError, LowbitError, NaNPolicyError
from lowbit.formats.base import Format
from lowbit.formats.floats import FloatFormat
from lowbit.formats.ints import IntFormat
from lowbit.formats.valueset import ValueSetFormat

__all__ = [
    "canonical",
    "decode",
    "decode_float64",
    "encode",
    "exact_round_quotient",
    "is_negative",
    "max_magnitude_code",
    "special",
    "value_of_magnitude",
]

_TWO64 = 1 << 64


# ---- float formats: what each code means ----------------------------------------------


def _mbits(fmt: FloatFormat) -> int:
    """Bits of the magnitude (exponent and mantissa fields)."""
    return fmt.ebits + fmt.mbits


@lru_cache(maxsize=1 << 20)
def value_of_magnitude(fmt: FloatFormat, mag: int) -> Fraction:
    """Exact value of magnitude code ``mag`` by the field formula, ignoring specials.

    ``mag`` may be one past the largest code: the formula then gives the value the grid
    would continue with if the exponent were unbounded (IEEE 754 §7.4).
    """
    m = fmt.mbits
    e, f = mag >> m, mag & ((1 << m) - 1)
    if e == 0 and fmt.subnormals:
        return Fraction(f) * Fraction(2) ** (1 - fmt.bias - m)
    if e == 0 and f == 0 and m > 0:
        return Fraction(0)  # the all-zeros code of a format without subnormals
    return Fraction((1 << m) + f) * Fraction(2) ** (e - fmt.bias - m)


def _has_zero(fmt: FloatFormat) -> bool:
    return value_of_magnitude(fmt, 0) == 0


def special(fmt: FloatFormat, code: int) -> str | None:
    """``"nan"``, ``"inf"`` or None (finite) for a float code (sign bit included)."""
    mb = _mbits(fmt)
    mag = code & ((1 << mb) - 1)
    negative = fmt.signed and (code >> mb) & 1 == 1
    top = (1 << mb) - 1
    exp_all_ones = ((1 << fmt.ebits) - 1) << fmt.mbits
    if fmt.nan is NaN.NEG_ZERO and negative and mag == 0:
        return "nan"
    if fmt.nan is NaN.HIGH and mag == top:
        return "nan"
    if fmt.nan is NaN.IEEE and mag > exp_all_ones:
        return "nan"
    if fmt.inf is Inf.IEEE and mag == exp_all_ones:
        return "inf"
    if fmt.inf is Inf.HIGH and mag == top - (1 if fmt.nan is NaN.HIGH else 0):
        return "inf"
    return None


@cache
def max_magnitude_code(fmt: FloatFormat) -> int:
    """The largest magnitude code that holds a finite value."""
    mag = (1 << _mbits(fmt)) - 1
    if fmt.nan is NaN.IEEE:  # skip the whole NaN range at once
        mag = min(mag, ((1 << fmt.ebits) - 1) << fmt.mbits)
    while special(fmt, mag) is not None:
        mag -= 1
    return mag


def _check_code(fmt: Format, code: int) -> int:
    if isinstance(code, bool) or not isinstance(code, int):
        code = int(code)
    if not 0 <= code < (1 << fmt.bits):
        raise CodeRangeError(f"code {code} is out of range for {fmt.name}")
    return code


def is_negative(fmt: Format, code: int) -> bool:
    """Whether the code's value is negative (its sign bit, for zeros and NaNs too)."""
    code = _check_code(fmt, code)
    if isinstance(fmt, FloatFormat):
        return fmt.signed and (code >> _mbits(fmt)) & 1 == 1
    if isinstance(fmt, IntFormat):
        return fmt.signed and (code >> (fmt.nbits - 1)) & 1 == 1
    if isinstance(fmt, ValueSetFormat):
        return fmt.table[code] < 0
    raise LowbitError(f"no reference for {type(fmt).__name__}")


def decode(fmt: Format, code: int) -> Fraction | float:
    """Exact value of a code: a Fraction, or ``float('inf')``, ``-inf`` or ``nan``.

    The sign of a zero is :func:`is_negative`.
    """
    code = _check_code(fmt, code)
    if isinstance(fmt, FloatFormat):
        kind = special(fmt, code)
        neg = is_negative(fmt, code)
        if kind == "nan":
            return math.nan
        if kind == "inf":
            return -math.inf if neg else math.inf
        mag = code & ((1 << _mbits(fmt)) - 1)
        value = value_of_magnitude(fmt, mag)
        return -value if neg else value
    if isinstance(fmt, IntFormat):
        if fmt.signed and code >> (fmt.nbits - 1):
            return Fraction(code - (1 << fmt.nbits))
        return Fraction(code)
    if isinstance(fmt, ValueSetFormat):
        if code >= len(fmt.table):
            raise CodeRangeError(f"code {code} is out of range for {fmt.name}")
        return Fraction(fmt.table[code])
    raise LowbitError(f"no reference for {type(fmt).__name__}")


def decode_float64(fmt: Format, code: int) -> float:
    """The code's value as a float64: signed zeros kept, NaN with the code's sign bit."""
    value = decode(fmt, code)
    sign = -1.0 if is_negative(fmt, code) else 1.0
    if isinstance(value, float):
        return math.copysign(value, sign)
    return math.copysign(float(value), sign)


def _nan_code(fmt: FloatFormat, negative: bool) -> int:
    """The quiet NaN code written for a NaN (or an overflow) of the given sign."""
    mb = _mbits(fmt)
    sign = (1 << mb) if fmt.signed and negative else 0
    if fmt.nan is NaN.NEG_ZERO:
        return 1 << mb
    if fmt.nan is NaN.HIGH:
        return sign | ((1 << mb) - 1)
    if fmt.nan is NaN.IEEE:
        return sign | (((1 << fmt.ebits) - 1) << fmt.mbits) | (1 << (fmt.mbits - 1))
    raise AssertionError("no NaN code")


def _inf_mag(fmt: FloatFormat) -> int:
    mag = max_magnitude_code(fmt) + 1
    while special(fmt, mag) != "inf":
        mag += 1
    return mag


def canonical(fmt: Format, code: int) -> int:
    """The code ``encode(decode(code))`` gives: itself, except NaNs become the quiet NaN."""
    code = _check_code(fmt, code)
    if isinstance(fmt, FloatFormat) and special(fmt, code) == "nan":
        return _nan_code(fmt, is_negative(fmt, code))
    if isinstance(fmt, ValueSetFormat) and code >= len(fmt.table):
        raise CodeRangeError(f"code {code} is out of range for {fmt.name}")
    return code


# ---- encoding -------------------------------------------------------------------------


def encode(
    fmt: Format,
    x: float,
    rounding: str | Rounding = "nearest_even",
    saturate: bool | None = None,
    random_bits: int | None = None,
    nan: str = "raise",
) -> int:
    """The code of one float ``x`` (rounded once, from its exact value).

    Args:
        fmt: a FloatFormat, IntFormat or ValueSetFormat.
        x: a Python float (any float64, including ±0, ±inf and NaN).
        rounding: a :class:`~lowbit.Rounding` or its name.
        saturate: floats: True clamps overflow to ±max (None = False); integers: True or
            None clamp, False wraps modulo ``2**bits``; value sets always clamp.
        random_bits: for ``stochastic``: an int in ``[0, 2**64)``.
        nan: ``"raise"`` or ``"zero"``: what a NaN becomes in a format without NaN.

    Returns:
        The code, an int.

    Raises:
        NaNPolicyError: NaN into a format without NaN under ``nan="raise"``.
        LowbitError: a negative into an unsigned float format with no NaN and no
            saturation; a bad argument.
    """
    mode = as_rounding(rounding)
    if nan not in ("raise", "zero"):
        raise LowbitError(f"unknown NaN policy {nan!r}")
    if mode is Rounding.STOCHASTIC:
        if random_bits is None or not 0 <= int(random_bits) < _TWO64:
            raise LowbitError("stochastic rounding needs random_bits in [0, 2**64)")
        random_bits = int(random_bits)
    x = float(x)
    if isinstance(fmt, FloatFormat):
        return _encode_float(fmt, x, mode, bool(saturate), random_bits, nan)
    if isinstance(fmt, IntFormat):
        return _encode_int(fmt, x, mode, saturate is not False, random_bits, nan)
    if isinstance(fmt, ValueSetFormat):
        return _encode_valueset(fmt, x, mode, random_bits, nan)
    raise LowbitError(f"no reference for {type(fmt).__name__}")


def _no_nan(fmt: Format, nan: str) -> int:
    if nan == "raise":
        raise NaNPolicyError(f"NaN input and {fmt.name} has no NaN code")
    return 0


def _round_up(
    mode: Rounding,
    neg: bool,
    X: Fraction,
    lo: Fraction,
    hi: Fraction,
    lo_is_even: bool,
    random_bits: int | None,
) -> bool:
    """Whether ``X`` (``lo < X < hi``, magnitudes) rounds to ``hi``."""
    if mode is Rounding.NEAREST_EVEN:
        twice = 2 * X
        return twice > lo + hi or (twice == lo + hi and not lo_is_even)
    if mode is Rounding.NEAREST_AWAY:
        return 2 * X >= lo + hi
    if mode is Rounding.TOWARD_ZERO:
        return False
    if mode is Rounding.TOWARD_POSITIVE:
        return not neg
    if mode is Rounding.TOWARD_NEGATIVE:
        return neg
    assert random_bits is not None
    return random_bits < (X - lo) / (hi - lo) * _TWO64


def _encode_float(
    fmt: FloatFormat,
    x: float,
    mode: Rounding,
    saturate: bool,
    random_bits: int | None,
    nan: str,
) -> int:
    mb = _mbits(fmt)
    neg = math.copysign(1.0, x) < 0
    if math.isnan(x):
        return _nan_code(fmt, neg) if fmt.has_nan else _no_nan(fmt, nan)
    if not fmt.signed and neg and x != 0 and not fmt.has_nan and not saturate:
        raise LowbitError(f"negative input for the unsigned format {fmt.name} (no NaN code)")
    maxc = max_magnitude_code(fmt)
    if math.isinf(x):
        mag, finite = maxc + 1, False  # an infinity always overflows
    else:
        X = Fraction(abs(x))
        # k: the largest magnitude code in 0..maxc+1 with v(k) <= X (-1 if none)
        lo_k, hi_k = -1, maxc + 2
        while hi_k - lo_k > 1:
            mid = (lo_k + hi_k) // 2
            if value_of_magnitude(fmt, mid) <= X:
                lo_k = mid
            else:
                hi_k = mid
        k = lo_k
        if k == -1:  # below the smallest value of a format without zero
            mag = 0
        elif k == maxc + 1 or value_of_magnitude(fmt, k) == X:
            mag = k
        else:
            lo, hi = value_of_magnitude(fmt, k), value_of_magnitude(fmt, k + 1)
            steps = lo / (hi - lo)
            assert steps.denominator == 1
            up = _round_up(mode, neg, X, lo, hi, steps.numerator % 2 == 0, random_bits)
            mag = k + int(up)
        finite = True

    sign_bit = 1 << mb if fmt.signed else 0
    if mag > maxc:  # overflow
        toward_zero = (
            mode is Rounding.TOWARD_ZERO
            or (mode is Rounding.TOWARD_POSITIVE and neg)
            or (mode is Rounding.TOWARD_NEGATIVE and not neg)
        )
        if saturate or (toward_zero and finite):
            mag = maxc
        elif fmt.has_inf:
            if neg and not fmt.signed:
                return _nan_code(fmt, True)
            return (sign_bit if neg else 0) | _inf_mag(fmt)
        elif fmt.has_nan:
            return _nan_code(fmt, neg)
        else:
            mag = maxc
    is_zero = value_of_magnitude(fmt, mag) == 0
    if fmt.signed:
        if is_zero and neg and not fmt.has_negative_zero:
            return mag  # -0 -> +0 in formats whose -0 code is a NaN
        return (sign_bit if neg else 0) | mag
    if neg and x != 0 and not is_zero:
        # a negative value an unsigned format cannot hold
        return 0 if saturate else _nan_code(fmt, True)
    return mag


# ---- integers and value sets ----------------------------------------------------------


def _encode_int(
    fmt: IntFormat,
    x: float,
    mode: Rounding,
    saturate: bool,
    random_bits: int | None,
    nan: str,
) -> int:
    lo_v = -(1 << (fmt.nbits - 1)) if fmt.signed else 0
    hi_v = (1 << (fmt.nbits - 1)) - 1 if fmt.signed else (1 << fmt.nbits) - 1
    if math.isnan(x):
        return _no_nan(fmt, nan)
    if math.isinf(x):
        n = hi_v if x > 0 else lo_v
    else:
        X = Fraction(x)
        neg = X < 0
        A = abs(X)
        fl = math.floor(A)
        if A == fl:
            n_mag = fl
        else:  # the same magnitude rule as the float formats, on the integer grid
            up = _round_up(mode, neg, A, Fraction(fl), Fraction(fl + 1), fl % 2 == 0, random_bits)
            n_mag = fl + int(up)
        n = -n_mag if neg else n_mag
        if saturate:
            n = min(max(n, lo_v), hi_v)
    return n % (1 << fmt.nbits)


def _encode_valueset(
    fmt: ValueSetFormat,
    x: float,
    mode: Rounding,
    random_bits: int | None,
    nan: str,
) -> int:
    table = [Fraction(v) for v in fmt.table]
    if math.isnan(x):
        if nan == "raise":
            raise NaNPolicyError(f"NaN input and {fmt.name} has no NaN code")
        x = 0.0
    if x <= table[0]:
        return 0
    if x >= table[-1]:
        return len(table) - 1
    X = Fraction(x)
    i = max(j for j, v in enumerate(table) if v <= X)
    if table[i] == X:
        return i
    lo, hi = table[i], table[i + 1]
    if mode is Rounding.NEAREST_EVEN:
        d_lo, d_hi = X - lo, hi - X
        up = d_hi < d_lo or (d_hi == d_lo and (i + 1) % 2 == 0)
    elif mode is Rounding.NEAREST_AWAY:
        d_lo, d_hi = X - lo, hi - X
        up = d_hi < d_lo or (d_hi == d_lo and abs(hi) >= abs(lo))
    elif mode is Rounding.TOWARD_ZERO:
        # the neighbour nearer zero; around a gap with no zero, the one of x's sign
        up = hi <= 0 or (lo < 0 < hi and X > 0)
    elif mode is Rounding.TOWARD_POSITIVE:
        up = True
    elif mode is Rounding.TOWARD_NEGATIVE:
        up = False
    else:
        assert random_bits is not None
        up = random_bits < (X - lo) / (hi - lo) * _TWO64
    return i + int(up)


# ---- exact rounding of x / s (the quantizers' tie breaker) ---------------------------


def exact_round_quotient(x: np.ndarray, s: np.ndarray, mode: Rounding) -> np.ndarray:
    """round(x / s) for the exact rational quotient, elementwise (a few elements; Fractions).

    The quantizers divide in float32 or float64 and send here only the elements whose
    rounded quotient lands on a tie, where the float quotient may not be the exact one.

    Args:
        x: float array of numerators.
        s: float array of divisors, ``x``'s size.
        mode: ``Rounding.NEAREST_EVEN`` or ``Rounding.NEAREST_AWAY`` (how exact ties go).

    Returns:
        float64 array of ``x``'s shape holding the rounded integers.
    """
    out = np.empty(x.shape, dtype=np.float64)
    for i, (xv, sv) in enumerate(zip(x.reshape(-1).tolist(), s.reshape(-1).tolist(), strict=True)):
        q = Fraction(xv) / Fraction(sv)
        fl = math.floor(q)
        frac = q - fl
        if frac > Fraction(1, 2):
            r = fl + 1
        elif frac < Fraction(1, 2):
            r = fl
        elif mode is Rounding.NEAREST_AWAY:
            r = fl + 1 if q > 0 else fl
        else:
            r = fl + (fl % 2)
        out.reshape(-1)[i] = r
    return out
