"""Scales per group: a scale rounded to its format, NVFP4's two-level scales, and the choice by
scale method (``lowbit.quant._engine``'s and ``lowbit.quant._tiles``' scales); and the value of
every code."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit._parallel import map_chunks
from lowbit.errors import LowbitError
from lowbit.formats.base import Format
from lowbit.formats.catalog import format as lookup
from lowbit.quant._range import mx_scales
from lowbit.quant.scales import (
    asymmetric_range,
    grid_quantizer,
    int_range,
    meanabs,
    symmetric_clip,
)
from lowbit.quant.scheme import ScaleMethod, Scheme


def round_scale(s64: np.ndarray, scale_format: str) -> np.ndarray:
    """Round float64 scales to the scale format (float32 values); never to zero. A scale
    beyond the format's range is a LowbitError (saturating it would clip its group)."""
    if scale_format == "float32":
        with np.errstate(over="ignore"):
            s = s64.astype(np.float32)
        tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    elif scale_format == "float8_e8m0fnu":
        # round up to a power of two (NVIDIA's RCEIL rule): nothing that absmax keeps clips
        m, e = np.frexp(s64)
        exp = np.where(m == 0.5, e - 1, e).astype(np.int64)
        s = np.ldexp(np.float32(1.0), np.clip(exp, -127, 127).astype(np.int32)).astype(np.float32)
        s = np.where(exp > 127, np.float32(np.inf), s)  # 2**128 and up: no E8M0 code
        tiny = np.float32(2.0**-127)
    else:
        f = lookup(scale_format)
        # not saturating: a scale past the format's max is an error, as in float32
        s = f.decode(f.encode(s64, saturate=False), dtype=np.float32)
        tiny = np.float32(f.smallest_positive)
    if not np.isfinite(s).all():
        raise LowbitError(
            f"a scale overflows {scale_format} (the input's range is too large for it): "
            f"a group needs a scale of {float(np.max(s64)):.4g}"
        )
    return np.where((s == 0) & (s64 > 0), tiny, s).astype(np.float32)


#: IEEE binary formats as unsigned words: (word type, magnitude mask, +inf's word)
_WORDS = {
    "float64": (np.uint64, 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000),
    "float32": (np.uint32, 0x7FFF_FFFF, 0x7F80_0000),
    "float16": (np.uint16, 0x7FFF, 0x7C00),
    "bfloat16": (np.uint16, 0x7FFF, 0x7F80),
}
_AMAX_CHUNK = 1 << 22  # elements per step: a few MB of temporaries
#: dtypes whose words :func:`finite_amax` reads as stored (no float copy)
IN_PLACE_DTYPES = frozenset(_WORDS)


def finite_amax(arr: np.ndarray) -> np.float32:
    """The largest finite ``|value|`` of ``arr`` as float32 (0 when there is none), exactly
    ``float32(max(abs(arr[isfinite(arr)])))``, read in place from the stored words: with the
    sign bit cleared an IEEE float's word orders as its magnitude and the non-finite ones are
    those from +inf's word up. No float copy of the tensor is made (NVFP4's tensor scale of a
    bfloat16 ``gate_proj`` read 235 MB of float32 temporaries three times over before)."""
    words = _WORDS.get(arr.dtype.name) if arr.dtype.isnative else None
    if words is None:  # another dtype: the float32/float64 route
        a = np.asarray(arr, dtype=np.float64)
        finite = a[np.isfinite(a)]
        return np.float32(np.max(np.abs(finite))) if finite.size else np.float32(0)
    utype, mask, inf = words
    flat = arr.reshape(-1).view(utype)

    def chunk(i: int) -> int:
        w = flat[i : i + _AMAX_CHUNK] & utype(mask)
        w[w >= utype(inf)] = 0
        return int(w.max(initial=0))

    # chunks on the chunk threads: a tensor read from a memory-mapped file is read here first
    best = max(map_chunks(chunk, range(0, flat.size, _AMAX_CHUNK)), default=0)
    return np.float32(np.array([best], dtype=utype).view(arr.dtype)[0])


def own_tensor_scale(arr: np.ndarray, scheme: Scheme) -> np.float32:
    """The float32 tensor scale of a two-level scheme (NVFP4): ``scale_max * element_max /
    amax`` computed in float32 as compressed-tensors' ``generate_gparam`` does, i.e.
    ``float32(float32(1 / amax) * 2688)`` (the encode
    direction: values are ``code * group_scale / g``); 1.0 for an all-zero tensor, as there.

    Raises:
        LowbitError: a nonzero tensor so small that the tensor scale overflows float32.
    """
    amax = finite_amax(arr)
    top = np.float32(lookup(scheme.scale_format).max * scheme.element_format.max)
    if amax == 0:
        return np.float32(1.0)
    with np.errstate(over="ignore", divide="ignore"):
        # torch evaluates ``2688.0 / amax`` as ``amax.reciprocal() * 2688.0``: two float32
        # roundings, which this repeats so the tensor scale is compressed-tensors' to the bit
        g = np.float32(np.float32(np.float32(1.0) / amax) * top)
    if not np.isfinite(g):
        raise LowbitError(
            f"{scheme.label}: the tensor's largest |value| {float(amax):.4g} is too small for a "
            f"float32 tensor scale ({float(top):g}/amax overflows); scale the tensor up or keep "
            "it unquantized"
        )
    return g


def two_level_scales(amax: np.ndarray, g: np.float32, scheme: Scheme) -> np.ndarray:
    """Group scales of a two-level scheme, as compressed-tensors' ``calculate_qparams``
    computes them: ``RNE_e4m3(min(g * float32(amax / element_max), 448))`` with every
    product rounded to float32, and 0 replaced by 0.125 (its E4M3 epsilon)."""
    f = lookup(scheme.scale_format)
    per = (amax.astype(np.float32) / np.float32(scheme.element_format.max)).astype(np.float32)
    s = np.minimum(per * np.float32(g), np.float32(f.max)).astype(np.float32)
    s = f.decode(f.encode(s, saturate=True), dtype=np.float32)
    return np.where(s == 0, np.float32(0.125), s).astype(np.float32)


def effective_scale(block: np.ndarray, g: np.float32 | None) -> np.ndarray:
    """What the codes multiply: ``float32(group_scale / g)`` (the group scale without a
    tensor scale)."""
    if g is None:
        return block
    return (block.astype(np.float32) / np.float32(g)).astype(np.float32)


def choose_scale(
    V: np.ndarray,
    axes: tuple[int, ...],
    mn: np.ndarray,
    mx: np.ndarray,
    scheme: Scheme,
    fmt: Format,
    g: np.float32 | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(float32 scale, float64 zero point or None, float64 threshold or None) per group;
    under a tensor scale ``g`` the scale is the stored group scale (not divided by ``g``)."""
    method = scheme.scale_method
    if g is not None:
        return two_level_scales(np.maximum(mx, -mn), g, scheme), None, None
    if scheme.is_mx:
        return mx_scales(np.maximum(mx, -mn), scheme), None, None
    if method is ScaleMethod.MEANABS:
        if fmt.name not in ("binary", "ternary"):
            raise LowbitError(
                f"the meanabs scale is for binary and ternary formats, not {fmt.name}"
            )
        s64, thresh = meanabs(V, axes, fmt.name == "ternary")
        return round_scale(np.where(s64 > 0, s64, 1.0), scheme.scale_format), None, thresh
    if not scheme.symmetric:
        qmin, qmax = int_range(fmt, scheme.restricted_range)
        lo, hi = asymmetric_range(
            V, axes, method, mn, mx, percentile=scheme.percentile, k_std=scheme.k_std,
            qrange=(qmin, qmax),
        )  # fmt: skip
        span = hi - lo
        s32 = round_scale(np.where(span > 0, span / (qmax - qmin), 1.0), scheme.scale_format)
        zp = np.clip(np.rint(qmin - lo / s32.astype(np.float64)), qmin, qmax)
        return s32, zp, None
    qrange = int_range(fmt, scheme.restricted_range) if fmt.kind == "int" else None
    qmax = float(fmt.max)
    quantizer = grid_quantizer(fmt, qrange) if method is ScaleMethod.MSE else None
    c = symmetric_clip(
        V, axes, method, mn, mx, percentile=scheme.percentile, k_std=scheme.k_std,
        quantizer=quantizer, qmax=qmax,
    )  # fmt: skip
    return round_scale(np.where(c > 0, c / qmax, 1.0), scheme.scale_format), None, None


def value_table(fmt: Format, dtype: Any) -> np.ndarray:
    """Value of every code 0 .. 2**bits - 1 in ``dtype`` (NaN for codes a value set lacks)."""
    n = 1 << fmt.bits
    if fmt.kind == "valueset":
        t = np.full(n, np.nan, dtype=dtype)
        t[: fmt.finite_count] = fmt.values().astype(dtype)
        return t
    return fmt.decode(np.arange(n, dtype=np.uint32), dtype=dtype)
