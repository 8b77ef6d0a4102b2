"""Scaled rounding and fake quantization: :class:`Quantizer`, :func:`fake_quantize`.

A scale divides: ``x_hat = round(x / scale) * scale`` (the QuantizedTensor convention).
:func:`fake_quantize` passes the gradient straight through, clipped (the default) or not.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import torch

from lowbit.enums import Rounding, as_rounding
from lowbit.errors import LowbitError
from lowbit.formats.base import Format
from lowbit.formats.catalog import format as get_format
from lowbit.torch.rounding import _limits, round_to

__all__ = ["Quantizer", "fake_quantize", "pow2_at_least"]


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
