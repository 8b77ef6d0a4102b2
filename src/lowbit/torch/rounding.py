"""Exact rounding of torch tensors to any lowbit format: :func:`round_to`, :func:`random_bits`.

:func:`round_to` gives exactly the values ``fmt.decode(fmt.encode(x))`` gives (one rounding
from the exact input value). It is fast where it can be: torch's native casts where they are
proven identical (float32 to bfloat16, float16, FP8 E4M3/E5M2 and the fnuz pair), a vectorised
``frexp``/``round`` path for the other float formats and for stochastic rounding,
``round``/``clamp`` for integers, a bucket search for value-set formats (NF4); the numpy codec
for everything else.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cache
from typing import Any

import numpy as np
import torch

from lowbit.enums import Rounding, as_rounding
from lowbit.errors import LowbitError, NaNPolicyError
from lowbit.formats.base import Format
from lowbit.formats.catalog import format as get_format
from lowbit.formats.floats import FloatFormat
from lowbit.formats.ints import IntFormat
from lowbit.formats.valueset import ValueSetFormat

__all__ = ["random_bits", "round_to"]

# Formats whose torch cast from float32 rounds exactly as lowbit's codec does (one rounding,
# ties to even), and whether that cast saturates on overflow (pinned by tests/torch_adapter/test_torch_adapter.py).
_NATIVE = {
    "bfloat16": ("bfloat16", False),
    "float16": ("float16", False),
    "float8_e4m3fn": ("float8_e4m3fn", True),
    "float8_e5m2": ("float8_e5m2", False),
    "float8_e4m3fnuz": ("float8_e4m3fnuz", False),
    "float8_e5m2fnuz": ("float8_e5m2fnuz", False),
}
_TWO32 = float(1 << 32)


def random_bits(shape: Iterable[int], seed: Any = None, device: Any = None) -> torch.Tensor:
    """Uniform 64-bit random integers (int64 holding uint64 bit patterns) for stochastic rounding.

    Args:
        shape: shape of the result.
        seed: an int, a ``torch.Generator`` or None (nondeterministic).
        device: device of the result.
    """
    return _draw_bits(shape, seed, device)


def _draw_bits(shape: Iterable[int], seed: Any, device: Any) -> torch.Tensor:
    gen = seed
    if not isinstance(seed, torch.Generator):
        gen = torch.Generator(device=device or "cpu")
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(int(seed))
    shape = tuple(shape)
    hi = torch.randint(0, 1 << 32, shape, generator=gen, dtype=torch.int64, device=device)
    lo = torch.randint(0, 1 << 32, shape, generator=gen, dtype=torch.int64, device=device)
    return (hi << 32) | lo  # wraps into the sign bit: the bit pattern is what counts


def round_to(
    x: torch.Tensor,
    fmt: str | Format,
    *,
    rounding: str | Rounding = "nearest_even",
    saturate: bool | None = None,
    seed: Any = None,
    random_bits: torch.Tensor | None = None,
    nan: str = "raise",
) -> torch.Tensor:
    """Round a tensor to the nearest values of ``fmt``, exactly as lowbit's codecs do.

    Equal, element for element and bit for bit, to ``fmt.decode(fmt.encode(x, ...))``
    (widened to ``x``'s dtype): one rounding from the exact value of ``x``, overflow and
    saturation as ``Format.encode`` documents (OCP OFP8 v1.0 §5 SAT/non-SAT; IEEE 754-2019
    §7.4 for overflow to infinity).

    Args:
        x: a floating-point tensor (any device; float16/bfloat16 work in float32).
        fmt: a catalog name or a Format.
        rounding: a rounding mode (nearest_even is the hardware default).
        saturate: as ``Format.encode``: True clamps overflow to ±max, False/None follow the
            format (inf, else NaN, else ±max); integer formats always clamp.
        seed: int or ``torch.Generator`` for stochastic rounding.
        random_bits: int64 tensor of uint64 bit patterns, broadcastable to ``x``, used instead
            of ``seed``: a value a fraction r of the way between its neighbours rounds up
            iff the unsigned bits are below ``r * 2**64`` (as ``Format.encode``).
        nan: ``"raise"`` or ``"zero"`` for NaN input to a format without NaN.

    Returns:
        A tensor of ``x``'s dtype, shape and device, not attached to the autograd graph
        (values a format has that ``x``'s dtype cannot hold, such as int32's largest in
        float32, are rounded again by that cast, as ``Format.round`` does).

    Raises:
        NaNPolicyError: NaN input for a format without NaN under ``nan="raise"``.
        LowbitError: a non-float tensor, or an unknown format/rounding/policy.
    """
    f = get_format(fmt)
    mode = as_rounding(rounding)
    if nan not in ("raise", "zero"):
        raise LowbitError(f"unknown NaN policy {nan!r}; allowed: 'raise', 'zero'")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise LowbitError("round_to needs a floating-point torch tensor")
    x = x.detach()
    dtype = x.dtype
    w = x if dtype in (torch.float32, torch.float64) else x.float()
    has_nan_fmt = getattr(f, "has_nan", False)
    if not has_nan_fmt and nan == "raise" and bool(torch.isnan(w).any()):
        raise NaNPolicyError(
            f"input contains NaN and {f.name} has no NaN code; pass nan='zero' to write +0"
        )
    rbits = None
    if mode is Rounding.STOCHASTIC:
        if random_bits is not None:
            rbits = torch.broadcast_to(random_bits.to(w.device, torch.int64), w.shape)
        else:
            rbits = _draw_bits(w.shape, seed, w.device)
    out = _round_fast(w, f, mode, saturate, rbits, nan)
    if out is None:
        out = _round_codec(w, f, mode, saturate, rbits, nan)
    return out if out.dtype == dtype else out.to(dtype)


def _round_fast(
    w: torch.Tensor,
    f: Format,
    mode: Rounding,
    saturate: bool | None,
    rbits: torch.Tensor | None,
    nan: str,
) -> torch.Tensor | None:
    """The torch implementations; None where none applies (the codec takes over)."""
    f32 = w.dtype == torch.float32
    if mode not in (Rounding.NEAREST_EVEN, Rounding.STOCHASTIC):
        return None
    if isinstance(f, FloatFormat):
        if not f.signed or not f.subnormals:
            return None
        if f.name in ("float32", "float64") and (f.name == "float64" or f32):
            out = w.clone()
            return out.clamp(-_limits(f)[1], _limits(f)[1]) if saturate else out
        if f32 and mode is Rounding.NEAREST_EVEN and f.name in _NATIVE:
            return _round_native(w, f, bool(saturate))
        mant_bits, min_exp = (23, -149) if f32 else (52, -1074)
        if f.mbits > mant_bits or f.emin - f.mbits < min_exp or f.emin > f.mbits + 1:
            return None
        if _limits(f)[1] >= float(torch.finfo(w.dtype).max):
            return None
        return _round_float(w, f, mode, bool(saturate), rbits, nan)
    if isinstance(f, IntFormat):
        if saturate is False or f.nbits > (24 if f32 else 53):
            return None
        a = torch.nan_to_num(w, nan=0.0) if nan == "zero" else w
        if mode is Rounding.NEAREST_EVEN:
            r = torch.round(a)
        else:  # away from zero with probability the fraction of the gap (as the codec)
            m = a.abs()
            fl = torch.floor(m)
            r = torch.copysign(fl + _sr_up(m - fl, rbits).to(a.dtype), a)
        return r.clamp(*_limits(f)) + 0.0  # integer zero has no sign
    if isinstance(f, ValueSetFormat) and mode is Rounding.NEAREST_EVEN:
        return _round_valueset(w, f, nan)
    return None


def _round_codec(
    w: torch.Tensor,
    f: Format,
    mode: Rounding,
    saturate: bool | None,
    rbits: torch.Tensor | None,
    nan: str,
) -> torch.Tensor:
    """Through the numpy codec, on the CPU (the definition the fast paths are tested against)."""
    arr = w.detach().cpu().double().numpy()  # exact
    rb = None if rbits is None else rbits.detach().cpu().numpy().view(np.uint64)
    codes = f.encode(arr, rounding=mode, saturate=saturate, random_bits=rb, nan=nan)
    vals = f.decode(codes, dtype=np.float64)
    return torch.from_numpy(vals).to(device=w.device, dtype=w.dtype)


@cache
def _overflow_threshold(f: FloatFormat) -> float:
    """Smallest float32 that the codec sends past ``f.max`` (non-saturating): found by bisection."""
    lo = int(np.float32(f.max).view(np.uint32))  # rounds to max
    hi = 0x7F800000  # +inf: overflows
    while hi - lo > 1:
        mid = (lo + hi) // 2
        val = np.array([mid], dtype=np.uint32).view(np.float32)
        code = int(f.encode(val)[0])
        if f.is_nan_code(code) or code == f.inf_code:
            hi = mid
        else:
            lo = mid
    return float(np.array([hi], dtype=np.uint32).view(np.float32)[0])


def _round_native(w: torch.Tensor, f: FloatFormat, saturate: bool) -> torch.Tensor:
    tdtype, native_saturates = _NATIVE[f.name]
    out = w.to(getattr(torch, tdtype)).to(w.dtype)
    if saturate == native_saturates:
        return out
    if saturate:
        if f.has_inf:  # native gives ±inf: clamping also maps infinite input to ±max, as SAT does
            return out.clamp(-_limits(f)[1], _limits(f)[1])
        big = w.abs() >= _overflow_threshold(f)  # native gives NaN there
        return torch.where(big, torch.copysign(torch.full_like(w, _limits(f)[1]), w), out)
    big = w.abs() >= _overflow_threshold(f)  # native saturates; the format says inf or NaN
    blown = torch.copysign(torch.full_like(w, math.inf), w) if f.has_inf else w.new_tensor(math.nan)
    return torch.where(big, blown, out)


def _round_float(
    w: torch.Tensor,
    f: FloatFormat,
    mode: Rounding,
    saturate: bool,
    rbits: torch.Tensor | None,
    nan: str,
) -> torch.Tensor:
    """Scale each value so its grid spacing is 1, round to an integer, scale back.

    ``frexp`` gives ``x = mant * 2**ex``; the grid near x has spacing ``2**(eff - m)`` with
    ``eff = max(ex - 1, emin)``; ``y = mant * 2**(ex + m - eff)`` is exact and below
    ``2**(m+1)``, so rounding ``y`` to an integer is the one rounding the codec does.
    """
    m = f.mbits
    mant, ex = torch.frexp(w)
    eff = torch.clamp(ex - 1, min=f.emin)
    y = torch.ldexp(mant, ex + m - eff)
    if mode is Rounding.NEAREST_EVEN:
        r = torch.round(y)
    else:
        a = y.abs()
        fl = torch.floor(a)
        r = torch.copysign(fl + _sr_up(a - fl, rbits).to(a.dtype), y)
    out = torch.ldexp(r, eff - m)
    fmax = _limits(f)[1]
    blown = out.abs() > fmax  # NaN compares False; infinite input is caught here
    if saturate or (not f.has_inf and not f.has_nan):
        over = torch.copysign(torch.full_like(out, fmax), out)
    elif f.has_inf:
        over = torch.copysign(torch.full_like(out, math.inf), out)
    else:
        over = out.new_tensor(math.nan)
    out = torch.where(blown, over, out)
    if not f.has_nan and nan == "zero":
        out = torch.nan_to_num(out, nan=0.0)
    if not f.has_negative_zero:
        out = out + 0.0  # -0 + 0 = +0 under round-to-nearest; nothing else changes
    return out


def _sr_up(frac: torch.Tensor, rbits: torch.Tensor | None) -> torch.Tensor:
    """Whether to round up: unsigned ``rbits < ceil(frac * 2**64)``, exactly (frac in [0, 1))."""
    assert rbits is not None
    c = torch.ceil(frac.double() * 2.0**64)  # exact: frac has at most 53 significant bits
    c_hi = torch.floor(c / _TWO32)
    c_lo = (c - c_hi * _TWO32).long()
    c_hi = c_hi.long()
    r_hi = (rbits >> 32) & 0xFFFFFFFF
    r_lo = rbits & 0xFFFFFFFF
    return (r_hi < c_hi) | ((r_hi == c_hi) & (r_lo < c_lo))


def _round_valueset(w: torch.Tensor, f: ValueSetFormat, nan: str) -> torch.Tensor:
    """Nearest table entry, ties to the even code; values beyond the ends saturate."""
    t = torch.tensor(f.table, dtype=torch.float64, device=w.device)
    x = w.double()
    if nan == "zero":
        x = torch.nan_to_num(x, nan=0.0)
    x = x.clamp(t[0], t[-1])
    mids = (t[1:] + t[:-1]) / 2  # exact: table entries are float64
    hi = torch.bucketize(x, mids, right=False)  # number of midpoints strictly below x
    tie = x == mids[torch.clamp(hi, max=mids.numel() - 1)]
    # at a tie hi is the lower code; the codec then picks the even one of (hi, hi + 1)
    idx = torch.where(tie & (hi % 2 == 1), hi + 1, hi)
    return t[idx].to(w.dtype)


@cache
def _limits(f: Format) -> tuple[float, float]:
    """(min, max) of a format, cached (they are derived exactly, which takes a moment)."""
    return f.min, f.max
