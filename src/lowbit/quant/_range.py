"""The edges of a scale's range (``lowbit.quant._engine``'s checks) and the MX scale rules: MX
block scales past E8M0's 2**127 raise, and a nonzero tensor whose scales underflowed to all zeros warns (or
raises, under ``underflow="raise"``). docs/quantization.md, "Range", says why."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from lowbit.errors import LowbitError
from lowbit.formats.catalog import format as lookup
from lowbit.formats.catalog import mx_format
from lowbit.formats.mx import (
    E8M0_MAX_EXP,
    E8M0_MIN_EXP,
    MXFormat,
    scale_values,
    shared_exponent,
)

if TYPE_CHECKING:
    from lowbit.quant.scheme import Scheme


def mx_scales(amax: np.ndarray, scheme: Scheme) -> np.ndarray:
    """The float32 scales of MX blocks with largest magnitudes ``amax`` (OCP MX v1.0 §6.3).

    Raises:
        LowbitError: a block's shared exponent would exceed E8M0's 2**127. The OCP
            reference code (microxcaling) makes such a scale NaN; clamping it instead would
            saturate the block's large values and flush its small ones without a word.
    """
    mxf = mx_format(scheme.format)
    limit = math.ldexp(1.0, E8M0_MAX_EXP + 1 + mxf.emax_elem)  # floor(log2 amax) > 127 + emax
    if np.any(amax >= limit):
        raise LowbitError(
            f"a scale overflows float8_e8m0fnu (the input's range is too large for it): an "
            f"{scheme.format} block's largest |value| is {float(np.max(amax)):.4g}, and "
            f"E8M0's 2**127 holds blocks below 2**{E8M0_MAX_EXP + 1 + mxf.emax_elem} "
            f"= {limit:.4g}"
        )
    rule = scheme.scale_rule or "floor"
    if rule == "floor":
        return scale_values(shared_exponent(amax, mxf.emax_elem), mxf.int_shift)
    a = np.asarray(amax, dtype=np.float64)
    _, e = np.frexp(a)
    raw = e.astype(np.int64) - 1 - mxf.emax_elem  # unclamped floor(log2 amax) - emax
    raw = raw + _bump(a, raw, mxf, rule)
    if np.any((a > 0) & (raw > E8M0_MAX_EXP)):
        raise LowbitError(
            f"a scale overflows float8_e8m0fnu under the {rule} rule: an {scheme.format} "
            f"block's largest |value| {float(np.max(a)):.4g} needs a scale of 2**128"
        )
    exp = np.where(a > 0, np.clip(raw, E8M0_MIN_EXP, E8M0_MAX_EXP), E8M0_MIN_EXP)
    return scale_values(exp.astype(np.int32), mxf.int_shift)


def _bump(amax: np.ndarray, exp: np.ndarray, mxf: MXFormat, rule: str) -> np.ndarray:
    """1 where ``rule`` takes the next power of two above OCP's ``X0 = 2**exp``, else 0
    (:data:`lowbit.quant.scheme.MX_SCALE_RULES`); float64 arithmetic on powers of two is exact."""
    elem = mxf.element
    top = math.ldexp(float(elem.max), -mxf.int_shift)
    emax = mxf.emax_elem
    r = amax / np.ldexp(1.0, exp.astype(np.int64))  # amax / X0, in [2**emax, 2**(emax+1))
    nz = amax > 0
    if rule == "ceil":
        return (nz & (r > top)).astype(np.int64)
    if rule == "carry":
        # the element's spacing at its maximum: 2**(emax - mantissa bits), 2**-6 for MXINT8
        ulp = (
            math.ldexp(1.0, -mxf.int_shift)
            if elem.kind == "int"
            else math.ldexp(1.0, emax - elem.mbits)  # type: ignore[attr-defined]
        )
        odd = round(top / ulp) % 2 == 1  # a tie at top + ulp/2 rounds up to even
        half = top + ulp / 2
        return (nz & ((r > half) | ((r == half) & odd))).astype(np.int64)
    # ct: compressed-tensors rounds amax half-up to m bits of mantissa, then floors the power
    m = 3 if elem.name == "float6_e2m3fn" else 1
    sig = r / math.ldexp(1.0, emax)  # amax's significand, in [1, 2)
    return (nz & (sig >= 2.0 - math.ldexp(1.0, -(m + 1)))).astype(np.int64)


def scales_at_floor(scale: np.ndarray, scheme: Scheme) -> bool:
    """Whether every group's scale is the smallest its format holds, or 1 (an all-zero
    group's). Only then can a nonzero tensor quantize to all zeros: a scale above the
    floor maps each group's largest magnitude to a nonzero code (or saturates it)."""
    if scheme.is_mx:
        floor = math.ldexp(1.0, E8M0_MIN_EXP - mx_format(scheme.format).int_shift)
    elif scheme.scale_format == "float32":
        floor = float(np.finfo(np.float32).smallest_subnormal)
    elif scheme.scale_format == "float8_e8m0fnu":
        floor = 2.0**-127
    else:
        floor = float(lookup(scheme.scale_format).smallest_positive)
    return bool(np.all((scale <= floor) | (scale == 1)))
