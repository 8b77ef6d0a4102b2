"""Precision emulation for torch: round tensors, matmuls and their gradients through any format.

Numerics are lowbit's own: :func:`round_to` gives exactly the values
``fmt.decode(fmt.encode(x))`` gives (one rounding from the exact input value), tested code by
code against the numpy codecs. It is fast where it can be: torch's native casts where they
are proven identical (float32 to bfloat16, float16, FP8 E4M3/E5M2 and the fnuz pair), a
vectorised ``frexp``/``round`` path for the other float formats and for stochastic
rounding, ``round``/``clamp`` for integers, a bucket search for value-set formats (NF4); the
numpy codec for everything else.

This is emulation on the CPU (or any device): the values are those the low-precision
hardware would hold, the speed is not.

Conventions:
    * a scale divides: ``x_hat = round(x / scale) * scale`` (the QuantizedTensor convention);
    * :class:`EmulatedLinear` treats rounding as the identity in the backward pass (the
      straight-through estimator FP8 training and absmax QAT use: nothing is clipped there);
      :func:`fake_quantize` offers the clipped STE too.

Needs ``pip install 'lowbit[torch]'``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("lowbit.torch needs torch: pip install 'lowbit[torch]'") from exc

import numpy as np

from lowbit.errors import LowbitError, NaNPolicyError
from lowbit.formats.base import Format
from lowbit.formats.catalog import format as get_format
from lowbit.formats.enums import Rounding, as_rounding
from lowbit.formats.floats import FloatFormat
from lowbit.formats.ints import IntFormat
from lowbit.formats.valueset import ValueSetFormat

__all__ = [
    "EmulatedLinear",
    "EmulatedMatMul",
    "MatMul",
    "Quantizer",
    "emulate",
    "emulation_stats",
    "fake_quantize",
    "random_bits",
    "round_to",
]

# Formats whose torch cast from float32 rounds exactly as lowbit's codec does (one rounding,
# ties to even), and whether that cast saturates on overflow (pinned by tests/test_torch_adapter.py).
_NATIVE = {
    "bfloat16": ("bfloat16", False),
    "float16": ("float16", False),
    "float8_e4m3fn": ("float8_e4m3fn", True),
    "float8_e5m2": ("float8_e5m2", False),
    "float8_e4m3fnuz": ("float8_e4m3fnuz", False),
    "float8_e5m2fnuz": ("float8_e5m2fnuz", False),
}
_TWO32 = float(1 << 32)


# ---- rounding ---------------------------------------------------------------------------


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


# ---- scaling and fake quantization -------------------------------------------------------


def pow2_at_least(r: torch.Tensor) -> torch.Tensor:
    """The smallest power of two ``>= r`` (r > 0), exactly: ``2**ceil(log2 r)``."""
    mant, ex = torch.frexp(r)  # r = mant * 2**ex, mant in [0.5, 1)
    return torch.ldexp(torch.ones_like(r), torch.where(mant == 0.5, ex - 1, ex))


class Quantizer:
    """Rounds a tensor through a format, with optional scaling, and counts what happened.

    ``x_hat = round_to(x / scale, fmt) * scale`` with one scale per tensor, per channel or
    per group. Scalings:

    * ``"none"``: scale 1 (mixed precision: FP16/BF16 casts);
    * ``"absmax"``: ``amax / fmt.max`` rounded to float32; the quotient is rounded from its
      exact value and the product once to float32, so the values equal
      ``lowbit.quantize(x, fmt, axis=..., group_size=...).dequantize()`` (QAT);
    * ``"pow2"``: the smallest power of two putting ``amax`` under ``fmt.max / 2**margin``
      (exact scaling; the FP8 per-tensor "current scaling" recipe);
    * ``"mx"``: the OCP MX v1.0 §6.3 shared scale ``2**(floor(log2 amax) - emax_elem)``,
      elements clamped to ±max (use with ``group_size=32``).

    Args:
        fmt: catalog name or Format.
        scaling: one of the above.
        axis: one scale per index along this axis (weights ``[out, in]``: 0).
        group_size: one scale per ``group_size`` consecutive values of the last dimension;
            ``-1``: one per row (the whole last dimension: per-token activations).
        margin: headroom in powers of two (``"pow2"``).
        rounding, saturate: as :func:`round_to`; saturate defaults to True when scaling.
        seed: int or ``torch.Generator`` for stochastic rounding.
        count: keep the counters in :attr:`stats`: True (all), ``"overflow"`` (all but
            ``underflow``, which costs two passes over the tensor), or False.

    Counters (``stats``): ``values`` seen, ``overflow`` (finite in, inf/NaN out), ``saturated``
    (beyond ±max, clamped), ``underflow`` (nonzero in, zero out), ``nonfinite_in``.
    """

    def __init__(
        self,
        fmt: str | Format,
        *,
        scaling: str = "none",
        axis: int | None = None,
        group_size: int | None = None,
        margin: int = 0,
        rounding: str | Rounding = "nearest_even",
        saturate: bool | None = None,
        seed: Any = None,
        count: bool | str = True,
    ) -> None:
        if scaling not in ("none", "absmax", "pow2", "mx"):
            raise LowbitError(
                f"unknown scaling {scaling!r}; allowed: 'none', 'absmax', 'pow2', 'mx'"
            )
        if group_size is not None and (
            not isinstance(group_size, int) or (group_size < 1 and group_size != -1)
        ):
            raise LowbitError(f"group_size must be a positive integer or -1, got {group_size!r}")
        self.format = get_format(fmt)
        self.scaling = scaling
        self.axis = axis
        self.group_size = group_size
        self.margin = int(margin)
        self.rounding = as_rounding(rounding)
        self.saturate = (scaling != "none") if saturate is None else saturate
        self.count = count
        self.frozen = False  # evaluation: no counting (and no scale history, in subclasses)
        self._gen = None
        if self.rounding is Rounding.STOCHASTIC:
            if isinstance(seed, torch.Generator):
                self._gen = seed
            else:
                self._gen = torch.Generator()
                self._gen.manual_seed(0 if seed is None else int(seed))
        self.stats = dict.fromkeys(
            ("values", "overflow", "saturated", "underflow", "nonfinite_in"), 0
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.format.name!r}, scaling={self.scaling!r})"

    def amax(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x viewed as scale groups, the absolute maximum of each group)."""
        if self.group_size == -1:
            return x, x.abs().amax(dim=-1, keepdim=True)
        if self.group_size is not None:
            g, k = self.group_size, x.shape[-1]
            if k % g:
                raise LowbitError(
                    f"group_size {g} does not divide the last dimension ({k}) of shape "
                    f"{tuple(x.shape)}"
                )
            xg = x.reshape(*x.shape[:-1], k // g, g)
            return xg, xg.abs().amax(dim=-1, keepdim=True)
        if self.axis is not None:
            if not -x.ndim <= self.axis < x.ndim:
                raise LowbitError(f"axis {self.axis} is out of range for shape {tuple(x.shape)}")
            ax = self.axis % x.ndim
            dims = tuple(d for d in range(x.ndim) if d != ax)
            return x, (x.abs().amax(dim=dims, keepdim=True) if dims else x.abs())
        return x, x.abs().amax()

    def scale_for(self, amax: torch.Tensor) -> torch.Tensor:
        """The divisor for groups whose absolute maximum is ``amax`` (1 where it is 0 or not finite)."""
        fmax = _limits(self.format)[1]
        ok = (amax > 0) & torch.isfinite(amax)
        a = torch.where(ok, amax, torch.ones_like(amax)).double()
        if self.scaling == "absmax":
            s = (a / fmax).float()
        elif self.scaling == "pow2":
            # kept within float32's normal range so that x / s stays exact and finite
            s = (pow2_at_least(a / fmax) * 2.0**self.margin).clamp(2.0**-126, 2.0**126)
        elif self.scaling == "mx":
            emax = math.floor(math.log2(fmax))
            _, ex = torch.frexp(a)  # floor(log2 a) = ex - 1
            s = torch.ldexp(torch.ones_like(a), (ex - 1 - emax).clamp(-127, 127))
        else:
            s = torch.ones_like(a)
        return torch.where(ok, s.to(amax.dtype), torch.ones_like(amax))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fake(x)[0]

    def fake(self, x: torch.Tensor, mask: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(x_hat, and if ``mask``: where ``x / scale`` lies within [fmt.min, fmt.max])."""
        x = x.detach()
        kw: dict[str, Any] = {"rounding": self.rounding, "saturate": self.saturate, "nan": "zero"}
        if self._gen is not None:
            kw["seed"] = self._gen
        if self.scaling == "none":
            u, s = x, None
        else:
            xg, amax = self.amax(x)
            s = self.scale_for(amax)
            if self.scaling == "absmax":  # exact quotient, one rounding of the product
                u = xg.double() / s.double()
            else:  # power-of-two scales: exact in x's dtype
                u = xg / s
        q = round_to(u, self.format, **kw)
        if self.count and not self.frozen:
            self._tally(u, q)
        lo, hi = _limits(self.format)
        inside = ((u >= lo) & (u <= hi)).reshape(x.shape) if mask else None
        if s is None:
            return q, inside
        out = q * s.to(q.dtype) if self.scaling == "absmax" else q * s
        return out.to(x.dtype).reshape(x.shape), inside

    def _tally(self, u: torch.Tensor, q: torch.Tensor) -> None:
        st = self.stats
        st["values"] += u.numel()
        if self.count is True:
            # q is zero wherever u is, so the difference counts the values flushed to zero
            st["underflow"] += int(torch.count_nonzero(u)) - int(torch.count_nonzero(q))
        if u.numel() == 0:
            return
        lo, hi = torch.aminmax(u)  # one pass, no temporary (NaN propagates into both)
        top = max(-float(lo), float(hi))
        if math.isnan(float(lo)) or math.isnan(float(hi)):
            top = math.inf
        edge = _beyond(self.format)
        if top < edge:  # the common case: nothing rounds past max, nothing non-finite
            return
        fin = torch.isfinite(u)
        st["nonfinite_in"] += int((~fin).sum())
        st["overflow"] += int((fin & ~torch.isfinite(q)).sum())
        big = fin & (u.abs() >= edge)
        st["saturated"] += int((big & torch.isfinite(q)).sum())


@cache
def _limits(f: Format) -> tuple[float, float]:
    """(min, max) of a format, cached (they are derived exactly, which takes a moment)."""
    return f.min, f.max


@cache
def _beyond(f: Format) -> float:
    """Where magnitudes start to round past ``f.max`` (half the last gap above it; ties counted)."""
    v = f.values() if f.bits <= 16 else None
    if v is None or v.size < 2:
        return float(f.max)
    return float(v[-1] + (v[-1] - v[-2]) / 2)


class _FakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, qz: Quantizer, ste: str) -> Any:  # type: ignore[override]
        out, inside = qz.fake(x, mask=ste == "clipped")
        ctx.ste = ste
        if inside is not None:
            ctx.save_for_backward(inside)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        if ctx.ste == "clipped":
            (inside,) = ctx.saved_tensors
            g = g * inside
        return g, None, None


def fake_quantize(
    x: torch.Tensor,
    fmt: str | Format,
    *,
    scale: float | torch.Tensor | str | None = None,
    axis: int | None = None,
    group_size: int | None = None,
    ste: str = "clipped",
    rounding: str | Rounding = "nearest_even",
    saturate: bool | None = None,
) -> torch.Tensor:
    """Quantize and dequantize in the forward pass; pass the gradient straight through.

    Args:
        x: the tensor (weights or activations).
        fmt: catalog name or Format.
        scale: ``"absmax"`` for the symmetric absmax scale ``amax / fmt.max`` per tensor,
            per channel (``axis``) or per group (``group_size`` along the last dimension),
            with values equal to ``lowbit.quantize(...).dequantize()``; or a number or a
            tensor broadcast against ``x`` (``x_hat = round_to(x / scale) * scale`` in
            ``x``'s dtype); None means 1.
        axis, group_size: granularity of ``scale="absmax"``.
        ste: the gradient: ``"clipped"`` (default) passes it where ``x / scale`` lies within
            ``[fmt.min, fmt.max]`` and gives zero outside (where the forward clamps);
            ``"identity"`` passes it everywhere (Bengio et al. 2013, arXiv 1308.3432).
        rounding, saturate: as :func:`round_to`.

    Returns:
        A tensor like ``x``; its gradient is the STE's.

    Raises:
        LowbitError: an unknown ``ste``/``scale`` or a group size that does not divide.
    """
    if ste not in ("clipped", "identity"):
        raise LowbitError(f"unknown ste {ste!r}; allowed: 'clipped', 'identity'")
    if isinstance(scale, str):
        if scale != "absmax":
            raise LowbitError(f"unknown scale {scale!r}; allowed: a number, a tensor, 'absmax'")
        qz = Quantizer(fmt, scaling="absmax", axis=axis, group_size=group_size, rounding=rounding,
                       saturate=saturate, count=False)  # fmt: skip
        return _FakeQuant.apply(x, qz, ste)
    s = torch.as_tensor(1.0 if scale is None else scale, dtype=x.dtype, device=x.device)
    qz = _ScaledBy(fmt, s, rounding=rounding, saturate=saturate, count=False)
    return _FakeQuant.apply(x, qz, ste)


class _ScaledBy(Quantizer):
    """A quantizer with a given scale (broadcast against the input)."""

    def __init__(self, fmt: str | Format, scale: torch.Tensor, **kw: Any) -> None:
        super().__init__(fmt, scaling="pow2", **kw)  # any scaling: saturating by default
        self.given = scale

    def amax(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x.abs()

    def scale_for(self, amax: torch.Tensor) -> torch.Tensor:
        return torch.broadcast_to(self.given, amax.shape)


RoleSpec = str | Format | Callable[[], Any] | None


def _make(spec: RoleSpec, role: str = "input") -> Any:
    if spec is None:
        return None
    if isinstance(spec, (str, Format)):
        # underflow is counted where it matters (gradients): counting costs two passes
        return Quantizer(spec, count=True if role.startswith("grad") else "overflow")
    return spec()


class _Roles:
    """The six quantizers of one matmul: two operands, output, and three gradients."""

    names = ("input", "weight", "output", "grad_output", "grad_input", "grad_weight")

    def __init__(self, specs: dict[str, RoleSpec]) -> None:
        for n in self.names:
            setattr(self, n, _make(specs.get(n), n))

    def items(self) -> list[tuple[str, Any]]:
        return [(n, getattr(self, n)) for n in self.names if getattr(self, n) is not None]


def _q(qz: Any, x: torch.Tensor) -> torch.Tensor:
    return x if qz is None else qz(x)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, roles: _Roles
    ) -> Any:  # type: ignore[override]
        xq = _q(roles.input, x)
        wq = _q(roles.weight, w)
        y = torch.nn.functional.linear(xq, wq, b)
        ctx.save_for_backward(xq, wq)
        ctx.roles = roles
        ctx.has_bias = b is not None
        return _q(roles.output, y)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        xq, wq = ctx.saved_tensors
        r = ctx.roles
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        gq = _q(r.grad_output, g)
        dx = _q(r.grad_input, gq @ wq) if need_x else None
        g2 = gq.reshape(-1, gq.shape[-1])
        dw = _q(r.grad_weight, g2.t() @ xq.reshape(-1, xq.shape[-1])) if need_w else None
        db = _q(r.grad_weight, g2.sum(0)) if ctx.has_bias and need_b else None
        return dx, dw, db, None


class _MatMulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, roles: _Roles, rb: Any) -> Any:  # type: ignore[override]
        aq = _q(roles.input, a)
        bq = _q(rb, b)
        ctx.save_for_backward(aq, bq)
        ctx.roles = roles
        return _q(roles.output, aq @ bq)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        aq, bq = ctx.saved_tensors
        r = ctx.roles
        gq = _q(r.grad_output, g)
        da = _q(r.grad_input, gq @ bq.transpose(-1, -2))
        db = _q(r.grad_weight, aq.transpose(-1, -2) @ gq)
        return da, db, None, None


class EmulatedLinear(nn.Module):
    """An ``nn.Linear`` whose matmuls run on rounded inputs, weights and gradients.

    Forward: ``y = R_out(R_in(x) @ R_w(W).T + b)``; backward: ``g' = R_grad_out(g)``,
    ``dx = R_grad_in(g' @ R_w(W))``, ``dW = R_grad_w(g'.T @ R_in(x))``, ``db = R_grad_w(sum g')``
    (accumulation in the working dtype, like a float32 accumulator; rounding is the identity
    to the gradient). Shares the parameters of the linear it wraps.

    Args:
        linear: the module to wrap.
        **roles: ``input``, ``weight``, ``output``, ``grad_output``, ``grad_input``,
            ``grad_weight``: a format (plain rounding), a zero-argument factory returning a
            quantizer (a callable on tensors, e.g. :class:`Quantizer` or a delayed scaler),
            or None (no rounding).
    """

    def __init__(self, linear: nn.Linear, **roles: RoleSpec) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.roles = _Roles(roles)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LinearFn.apply(x, self.weight, self.bias, self.roles)

    def extra_repr(self) -> str:
        q = ", ".join(f"{n}={qz!r}" for n, qz in self.roles.items())
        return f"in_features={self.in_features}, out_features={self.out_features}, {q}"


class MatMul(nn.Module):
    """``a @ b`` as a module, so :func:`emulate` can find the matmuls that are not linears."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


class EmulatedMatMul(nn.Module):
    """``a @ b`` with both operands rounded by ``input``-role quantizers (as :class:`EmulatedLinear`)."""

    def __init__(self, **roles: RoleSpec) -> None:
        super().__init__()
        self.roles = _Roles(roles)
        self.rhs = _make(roles.get("input"))  # its own scaling state

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _MatMulFn.apply(a, b, self.roles, self.rhs)


def emulate(
    model: nn.Module,
    *,
    input: RoleSpec = None,
    weight: RoleSpec = None,
    output: RoleSpec = None,
    grad_output: RoleSpec = None,
    grad_input: RoleSpec = None,
    grad_weight: RoleSpec = None,
    matmuls: bool = True,
    exclude: Iterable[str] = (),
) -> nn.Module:
    """Swap every ``nn.Linear`` (and :class:`MatMul`) of ``model`` for an emulated one, in place.

    Each wrapped module gets its own quantizers (a factory is called once per role per
    module), so per-tensor scaling state is per tensor.

    Args:
        model: the model; its parameters are kept (optimizers built before stay valid).
        input, weight, output, grad_output, grad_input, grad_weight: as :class:`EmulatedLinear`.
        matmuls: also replace :class:`MatMul` modules (attention's matmuls); their operands
            use the ``input`` role.
        exclude: qualified module names (or prefixes) to leave alone, e.g. ``"lm_head"``.

    Returns:
        The same model.
    """
    roles = {
        "input": input,
        "weight": weight,
        "output": output,
        "grad_output": grad_output,
        "grad_input": grad_input,
        "grad_weight": grad_weight,
    }
    skip = tuple(exclude)
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if any(full == s or full.startswith(s + ".") for s in skip):
                continue
            if type(child) is nn.Linear:
                setattr(mod, child_name, EmulatedLinear(child, **roles))
            elif matmuls and type(child) is MatMul:
                setattr(mod, child_name, EmulatedMatMul(**roles))
    return model


def emulation_stats(model: nn.Module) -> dict[str, dict[str, int]]:
    """Counters of every quantizer in ``model``, summed per role (``grad_output``, ...)."""
    out: dict[str, dict[str, int]] = {}
    for mod in model.modules():
        if isinstance(mod, (EmulatedLinear, EmulatedMatMul)):
            items = mod.roles.items()
            if isinstance(mod, EmulatedMatMul) and mod.rhs is not None:
                items.append(("input", mod.rhs))
            for role, qz in items:
                st = getattr(qz, "stats", None)
                if st:
                    acc = out.setdefault(role, dict.fromkeys(st, 0))
                    for k, v in st.items():
                        acc[k] = acc.get(k, 0) + v
    return out
