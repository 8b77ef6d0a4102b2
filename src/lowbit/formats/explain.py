"""Explain single values and codes: what a conversion did, what a bit pattern means.

The functions behind ``lowbit show``, ``lowbit decode`` and ``lowbit values``. Each
returns a JSON-able dict, so the CLI stays a thin layer of printing, and the same
answers are available to notebooks and tests:

>>> import lowbit.formats.explain as ex
>>> r = ex.convert(0.3952, "e4m3")
>>> r["value"], r["bits"], r["status"]
(0.40625, '0 0101 101', 'rounded')
>>> ex.decode("float8_e4m3fn", 0x7E)["formula"]
'(-1)^0 × 2^(15-7) × 1.110b = 2^8 × 1.75 = 448'

Vocabulary of ``status`` (what happened to a value):

``exact``
    the value is representable (``subnormal`` says whether it is a subnormal).
``rounded``
    it lies between two representable values and was rounded to one of them.
``underflow``
    a non-zero value rounded to zero (float formats).
``overflow``
    beyond the largest finite value and became inf or NaN, as the format's
    specification says (OCP OFP8 v1.0 §5 non-saturating mode).
``saturated``
    beyond the largest finite value and clamped to ±max (OCP "SAT" mode; formats with
    neither inf nor NaN such as FP4/FP6 always do this, integer and value-set formats
    too).
``nan`` / ``inf``
    NaN or an infinity in, the same out.
``invalid``
    a negative value into an unsigned format became its NaN (OCP MX E8M0).
``unrepresentable``
    the format has no code for it (a NaN into a format with no NaN); no code is given.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

from lowbit.codecs.vectorised import prepare_random
from lowbit.enums import Inf, NaN, Rounding, as_rounding
from lowbit.errors import CodeRangeError, LowbitError, NaNPolicyError
from lowbit.formats.base import Format
from lowbit.formats.catalog import format as get_format
from lowbit.formats.floats import FloatFormat
from lowbit.formats.ints import IntFormat, round_to_integer

__all__ = [
    "convert",
    "decode",
    "exact_decimal",
    "parse_code",
    "parse_value",
    "short_decimal",
    "values",
]

#: Widest format ``values`` lists (2**8 codes).
MAX_LIST_BITS = 8


# ---- reading user input ------------------------------------------------------------


def parse_value(text: str | float) -> float:
    """Read a number the way ``lowbit show`` does, as the nearest float64.

    Accepts decimals (``0.3952``, ``-1e-3``, ``1_000``), hex floats (``0x1.8p-3``),
    fractions (``1/3``, rounded once to float64), ``inf``, ``-inf``, ``nan`` and ``-0``.

    Raises:
        LowbitError: the text is not a number.
    """
    bad = LowbitError(
        f"cannot read {_clip(text)} as a number; write a decimal (0.3952, -1e-3), "
        "a hex float (0x1.8p-3), a fraction (1/3), inf, -inf or nan"
    )
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        try:
            return float(text)
        except OverflowError:
            raise bad from None
    s = str(text).strip().replace(" ", "")
    if len(s) > MAX_NUMBER_CHARS:
        raise LowbitError(
            f"a number of {len(s):,} characters; lowbit reads at most {MAX_NUMBER_CHARS}"
        )
    low = s.lower()
    try:
        if "0x" in low:
            return float.fromhex(s)
        if "/" in s:
            # Fraction("1e999999999/3") would build a billion-digit integer: only plain
            # decimals with exponents of up to 4 digits (float64 needs 324)
            if not all(_FRACTION_PART.fullmatch(p) for p in s.split("/", 1)):
                raise ValueError(s)
            return float(Fraction(s))
        return float(s)
    except (ValueError, ZeroDivisionError, OverflowError):
        raise bad from None


#: The longest number or code ``lowbit show``/``decode`` read (float64's exact decimals have
#: at most 767 significant digits; codes at most 64 bits).
MAX_NUMBER_CHARS = 1100
_FRACTION_PART = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,4})?")


def _clip(text: object) -> str:
    if isinstance(text, int) and text.bit_length() > 600:
        return f"an integer of {text.bit_length():,} bits"
    r = repr(text) if isinstance(text, str) else repr(str(text)[:200])
    return r if len(r) <= 80 else r[:77] + "..."


def parse_code(text: str | int) -> int:
    """Read a code: hex (``0x7e``), binary (``0b01111110``) or decimal (``126``).

    Underscores and spaces are ignored (``0b0_1111_110``). A bare string of 0s and 1s
    that starts with 0 (``0110``) is read as binary, since nobody writes a decimal
    number with a leading zero.

    Raises:
        LowbitError: not an integer, or negative.
    """
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        code = int(text)
    else:
        s = str(text).strip().replace("_", "").replace(" ", "")
        if len(s) > MAX_NUMBER_CHARS:
            raise CodeRangeError(
                f"a code of {len(s):,} characters; no format's codes are wider than 64 bits"
            )
        try:
            code = int(s, 0)
        except ValueError:
            if len(s) > 1 and s[0] == "0" and set(s) <= {"0", "1"}:
                code = int(s, 2)
            elif s.isdigit():
                code = int(s, 10)
            else:
                raise LowbitError(
                    f"cannot read code {_clip(text)}; write it in hex (0x7e), "
                    "binary (0b01111110) or decimal (126)"
                ) from None
    if code.bit_length() > 64:  # no format has wider codes (and 4,300+ digits cannot print)
        raise CodeRangeError(
            f"a code of {code.bit_length():,} bits; no format's codes are wider than 64"
        )
    if code < 0:
        raise CodeRangeError(f"code {code} is negative; codes are unsigned bit patterns")
    return code


# ---- printing numbers exactly ------------------------------------------------------


def exact_decimal(x: float) -> str:
    """The exact decimal expansion of a float64 (every binary float has a finite one)."""
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    d = Decimal(x)
    if d == d.to_integral_value() and abs(x) < 1e21:
        return f"{'-' if math.copysign(1, x) < 0 else ''}{abs(int(d))}"
    return str(d)


def short_decimal(x: float) -> str:
    """Shortest text for x: Python's repr when that is exact, else ``≈`` + repr.

    Integers print without ``.0``; ``-0`` keeps its sign.
    """
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return exact_decimal(x)
    if x == int(x) and abs(x) < 1e16:
        return exact_decimal(x)
    r = repr(x)
    return r if Decimal(r) == Decimal(x) else "≈" + r


def _hex(code: int, bits: int) -> str:
    return f"0x{code:0{max(1, (bits + 3) // 4)}x}"


def _fields(fmt: Format, code: int) -> dict[str, str]:
    if isinstance(fmt, FloatFormat):
        s, e, m = fmt.split_bits(code)
        return {"sign": s, "exponent": e, "mantissa": m}
    return {"code": format(code, f"0{fmt.bits}b")}


def _bits_text(fields: dict[str, str]) -> str:
    return " ".join(v for v in fields.values() if v)


# ---- one value into one format -----------------------------------------------------


def convert(
    value: str | float,
    fmt: str | Format,
    *,
    rounding: str | Rounding = "nearest_even",
    saturate: bool = False,
    seed: int | None = None,
) -> dict[str, Any]:
    """What becomes of one value in one format: nearest value, code, fields, error, status.

    Integer formats round the value to an integer and value-set formats (NF4) to a raw
    table entry: no scale is applied.

    Args:
        value: a float, or text as :func:`parse_value` reads it.
        fmt: a format or its name.
        rounding: a :class:`~lowbit.Rounding` mode or alias.
        saturate: clamp overflow to ±max (OCP "SAT" conversion) instead of the format's
            default (inf where it has one, else NaN).
        seed: for stochastic rounding (a fixed one is drawn when None, so the reported
            status matches the reported value).

    Returns:
        A dict with ``format``, ``input``, ``code`` (int or None), ``hex``, ``bits``
        (fields separated by spaces), ``fields``, ``value``, ``value_exact`` (decimal),
        ``abs_error``, ``rel_error``, ``status`` (see the module docstring),
        ``subnormal`` and ``what`` (one phrase for people).

    Raises:
        UnknownFormatError, LowbitError: bad format name, value or rounding mode.
    """
    f = get_format(fmt)
    x = parse_value(value)
    mode = as_rounding(rounding)
    if mode is Rounding.STOCHASTIC and seed is None:
        seed = int(np.random.default_rng().integers(2**62))
    out: dict[str, Any] = {
        "format": f.name,
        "kind": f.kind,
        "input": x,
        "rounding": mode.value,
        "saturate": bool(saturate),
    }
    try:
        code = int(
            f.encode(np.float64(x), rounding=mode, saturate=True if saturate else None, seed=seed)
        )
    except NaNPolicyError:
        out.update(
            code=None,
            hex=None,
            bits=None,
            fields=None,
            value=None,
            value_exact=None,
            abs_error=None,
            rel_error=None,
            status="unrepresentable",
            subnormal=False,
            what=f"no NaN code in {f.name}",
        )
        return out
    v = float(f.decode(np.array(code, dtype=np.uint64), dtype=np.float64))
    fields = _fields(f, code)
    abs_err = rel_err = None
    if math.isfinite(x) and math.isfinite(v):
        diff = abs(Fraction(v) - Fraction(x))
        abs_err = _as_float(diff)
        rel_err = _as_float(diff / abs(Fraction(x))) if x != 0 else (0.0 if v == 0 else None)
    subnormal = f.kind == "float" and 0 < abs(v) < f.smallest_normal
    status, what = _classify(f, x, v, mode, seed, subnormal)
    out.update(
        code=code,
        hex=_hex(code, f.bits),
        bits=_bits_text(fields),
        fields=fields,
        value=v,
        value_exact=exact_decimal(v),
        abs_error=abs_err,
        rel_error=rel_err,
        status=status,
        subnormal=subnormal,
        what=what,
    )
    return out


def _as_float(q: Fraction) -> float:
    """q as a float; inf beyond float64's range (a relative error can exceed it)."""
    try:
        return float(q)
    except OverflowError:
        return math.inf


def _classify(
    f: Format, x: float, v: float, mode: Rounding, seed: int | None, subnormal: bool
) -> tuple[str, str]:
    """(status, phrase) for x -> v in format f."""
    unsigned = f.min >= 0
    if math.isnan(x):
        return "nan", "NaN stays NaN"
    if math.isnan(v):
        if x < 0 and unsigned:
            return "invalid", "negative → NaN (no sign bit)"
        if math.isinf(x):
            return "overflow", f"{'-' if x < 0 else ''}inf → NaN (no inf)"
        return "overflow", "overflow to NaN"
    if math.isinf(v):
        return ("inf", "inf stays inf") if math.isinf(x) else ("overflow", "overflow to inf")
    if math.isinf(x):
        return "saturated", f"{'-' if x < 0 else ''}inf saturated to {short_decimal(v)}"
    unbounded = _unbounded(f, x, mode, seed)
    if unbounded > f.max or unbounded < f.min:
        if x < 0 and unsigned:
            return "saturated", f"negative clamped to {short_decimal(v)}"
        return "saturated", f"saturated to {short_decimal(v)}"
    if v == x:
        if math.copysign(1, x) != math.copysign(1, v):
            return "exact", "exact (-0 → +0: no negative zero)"
        return "exact", "exact, subnormal" if subnormal else "exact"
    if v == 0 and f.kind == "float":
        return "underflow", f"underflow to {'-' if math.copysign(1, v) < 0 else ''}zero"
    if x == 0:
        return "rounded", f"no zero in {f.name}: smallest value"
    direction = "up" if v > x else "down"
    return "rounded", f"rounded {direction}" + (", subnormal" if subnormal else "")


def _unbounded(f: Format, x: float, mode: Rounding, seed: int | None) -> float:
    """x rounded on f's grid as if f had no largest value (for telling saturation apart)."""
    if isinstance(f, FloatFormat):
        if f.ebits >= 11:
            return x  # float64 input always fits float64's range
        wide = FloatFormat(
            name=f"{f.name}_unbounded",
            ebits=f.ebits + 1,
            mbits=f.mbits,
            bias=f.bias,
            signed=True,
            inf=Inf.NONE,
            nan=NaN.NONE,
            subnormals=f.subnormals,
        )
        code = wide.encode(np.float64(x), rounding=mode, saturate=True, seed=seed)
        return float(wide.decode(code, dtype=np.float64))
    if isinstance(f, IntFormat):
        arr = np.asarray(x, dtype=np.float64)
        return float(round_to_integer(arr, mode, prepare_random(mode, arr.shape, seed, None)))
    return x  # value sets: anything beyond the table's ends is clamped


# ---- one code of one format ---------------------------------------------------------


def decode(fmt: str | Format, code: str | int) -> dict[str, Any]:
    """What a code (bit pattern) means: value, class, fields and the formula.

    Args:
        fmt: a format or its name.
        code: an int, or text as :func:`parse_code` reads it.

    Returns:
        A dict with ``format``, ``code``, ``hex``, ``binary``, ``bits`` (fields separated
        by spaces), ``fields``, ``value``, ``value_exact``, ``class`` (normal, subnormal,
        zero, inf, NaN for floats; integer or zero for integers; table entry or zero for
        value sets) and ``formula``.

    Raises:
        CodeRangeError: the code does not fit the format.
    """
    f = get_format(fmt)
    c = parse_code(code)
    if c >= 1 << f.bits:
        raise CodeRangeError(
            f"code {_hex(c, f.bits)} is out of range for {f.name}: its {f.bits}-bit codes are "
            f"{_hex(0, f.bits)}..{_hex((1 << f.bits) - 1, f.bits)}"
        )
    v = float(f.decode(np.array(c, dtype=np.uint64), dtype=np.float64))
    fields = _fields(f, c)
    if isinstance(f, FloatFormat):
        cls, formula = _float_formula(f, c, v, fields)
    elif isinstance(f, IntFormat):
        cls, formula = _int_formula(f, c, v)
    else:
        cls = "zero" if v == 0 else "table entry"
        formula = f"table[{c}]{_equals(v)}"
    return {
        "format": f.name,
        "kind": f.kind,
        "code": c,
        "hex": _hex(c, f.bits),
        "binary": "0b" + format(c, f"0{f.bits}b"),
        "bits": _bits_text(fields),
        "fields": fields,
        "value": v,
        "value_exact": exact_decimal(v),
        "class": cls,
        "finite": math.isfinite(v),
        "formula": formula,
    }


def _float_formula(f: FloatFormat, code: int, v: float, fields: dict[str, str]) -> tuple[str, str]:
    s = int(fields["sign"] or "0", 2)
    e = int(fields["exponent"], 2) if fields["exponent"] else 0
    m = fields["mantissa"]
    mval = int(m, 2) if m else 0
    sign = f"(-1)^{s} × " if f.signed else ""
    if math.isnan(v):
        why = {
            NaN.IEEE: "exponent all ones, mantissa not zero",
            NaN.HIGH: "exponent and mantissa bits all ones" if f.mbits else "all bits ones",
            NaN.NEG_ZERO: "the negative-zero pattern (this format has no -0)",
        }[f.nan]
        return "NaN", f"NaN: {why}"
    if math.isinf(v):
        why = (
            "exponent all ones, mantissa zero"
            if f.inf is Inf.IEEE
            else "the largest magnitude code below the NaN"
        )
        return "inf", f"{'-' if v < 0 else '+'}inf: {why}"
    if v == 0:
        return "zero", f"{sign}0 = {short_decimal(v)}"
    if e == 0 and f.subnormals:
        sig = Fraction(mval, 1 << f.mbits)
        scale, lead = 1 - f.bias, "0"
        cls = "subnormal" if f.ebits else "normal"
        exp_text = f"2^(1-{f.bias})" if f.ebits else f"2^{scale}"
    else:
        sig = 1 + Fraction(mval, 1 << f.mbits)
        scale, lead = e - f.bias, "1"
        cls = "normal"
        exp_text = f"2^({e}-{f.bias})"
    neg = "-" if v < 0 else ""
    if m:
        text = f"{sign}{exp_text} × {lead}.{m}b = {neg}2^{scale} × {short_decimal(float(sig))}"
    else:  # no mantissa bits (E8M0): a power of two
        text = f"{sign}{exp_text} = {neg}2^{scale}"
    return cls, text + _equals(v)


def _equals(v: float) -> str:
    """`` = v`` or `` ≈ v`` (when the shortest repr of v is not exact)."""
    t = short_decimal(v)
    return f" ≈ {t[1:]}" if t.startswith("≈") else f" = {t}"


def _int_formula(f: IntFormat, code: int, v: float) -> tuple[str, str]:
    n = f.bits
    cls = "zero" if v == 0 else "integer"
    if f.signed and code >> (n - 1):
        low = code & ((1 << (n - 1)) - 1)
        bits = format(low, f"0{n - 1}b")
        return cls, (f"two's complement: -2^{n - 1} + {bits}b = -{1 << (n - 1)} + {low} = {int(v)}")
    return cls, f"{format(code, f'0{n}b')}b = {int(v)}"


# ---- every value of a small format --------------------------------------------------


def values(fmt: str | Format) -> list[dict[str, Any]]:
    """:func:`decode` of every code of a format of at most 8 bits, in code order.

    Raises:
        LowbitError: the format is wider than 8 bits.
    """
    f = get_format(fmt)
    if f.bits > MAX_LIST_BITS:
        raise LowbitError(
            f"{f.name} has {f.bits}-bit codes ({f.finite_count:,} finite values); "
            f"listing every value is for formats of at most {MAX_LIST_BITS} bits "
            f"(try `lowbit decode {f.name} CODE` or `lowbit formats`)"
        )
    count = 1 << f.bits
    if f.kind == "valueset":
        count = f.finite_count
    return [decode(f, c) for c in range(count)]
