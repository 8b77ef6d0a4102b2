"""The edges of a scale's range (``lowbit.quant._engine``'s checks): MX block scales past
E8M0's 2**127 raise, and a nonzero tensor whose scales underflowed to all zeros warns (or
raises, under ``underflow="raise"``). docs/quantization.md, "Range", says why."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from lowbit.errors import LowbitError
from lowbit.formats.catalog import format as lookup
from lowbit.formats.catalog import mx_format
from lowbit.formats.mx import E8M0_MAX_EXP, E8M0_MIN_EXP, scale_values, shared_exponent

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
    return scale_values(shared_exponent(amax, mxf.emax_elem), mxf.int_shift)


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
