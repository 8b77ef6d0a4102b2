"""Scale estimators: from a group of values to its clipping range and scale.

Every function works on a 4-D view ``V`` of the tensor and reduces over ``axes``
(``keepdims``), so one call handles every group of a tensor at once. Clipping ranges
are float64; the scale is the clipping magnitude over the largest value of the element
format (``amax / 127`` for int8, ``amax / 448`` for FP8 E4M3, ``amax`` for NF4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.quant.scheme import ScaleMethod

if TYPE_CHECKING:
    from lowbit.formats.base import Format

#: Clipping ratios the MSE search tries (fractions of absmax), per group.
MSE_RATIOS = np.linspace(0.30, 1.0, 36)

#: TWN's threshold factor (Li & Liu 2016, "Ternary Weight Networks", eq. 8):
#: delta = 0.7 * mean|x| is their approximation of the optimal threshold for
#: Gaussian-like weights.
TWN_THRESHOLD = 0.7


def int_range(fmt: Format, restricted: bool) -> tuple[int, int]:
    """(qmin, qmax) of an integer format, optionally the restricted symmetric range."""
    lo, hi = int(fmt.min), int(fmt.max)
    if restricted:
        lo = -hi
    return lo, hi


def minmax(V: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per-group (min, max) as float64, without an |x| temporary.

    Groups along the last axis of a contiguous array go through ``reduceat`` on the flat
    data (numpy's axis reduction handles short rows one at a time, several times slower).
    """
    G = V.shape[-1] if V.ndim else 1
    if axes == (V.ndim - 1,) and G > 1 and V.flags.c_contiguous and V.size:
        flat = V.reshape(-1)
        starts = np.arange(0, flat.size, G)
        shape = (*V.shape[:-1], 1)
        mn = np.minimum.reduceat(flat, starts).reshape(shape).astype(np.float64)
        mx = np.maximum.reduceat(flat, starts).reshape(shape).astype(np.float64)
        return mn, mx
    mx = np.max(V, axis=axes, keepdims=True).astype(np.float64)
    mn = np.min(V, axis=axes, keepdims=True).astype(np.float64)
    return mn, mx


def symmetric_clip(
    V: np.ndarray,
    axes: tuple[int, ...],
    method: ScaleMethod,
    mn: np.ndarray,
    mx: np.ndarray,
    *,
    percentile: float,
    k_std: float,
    quantizer: Any = None,
    qmax: float = 1.0,
) -> np.ndarray:
    """Clipping magnitude ``c >= 0`` per group (values beyond ±c saturate)."""
    amax = np.maximum(mx, -mn)
    if method is ScaleMethod.ABSMAX:
        return amax
    if method is ScaleMethod.PERCENTILE:
        c = np.percentile(np.abs(V), percentile, axis=axes, keepdims=True).astype(np.float64)
    elif method is ScaleMethod.MEANSTD:
        mean = np.mean(V, axis=axes, keepdims=True, dtype=np.float64)
        std = np.std(V, axis=axes, keepdims=True, dtype=np.float64)
        c = np.minimum(amax, np.abs(mean) + k_std * std)
    elif method is ScaleMethod.MSE:
        c = _mse_search(V, axes, amax, quantizer, qmax)
    else:  # pragma: no cover - the scheme rejects the rest
        raise LowbitError(f"scale method {method.value} does not apply here")
    # a clip of zero (e.g. a percentile of mostly zeros) falls back to absmax
    return np.where(c > 0, c, amax)


def asymmetric_range(
    V: np.ndarray,
    axes: tuple[int, ...],
    method: ScaleMethod,
    mn: np.ndarray,
    mx: np.ndarray,
    *,
    percentile: float,
    k_std: float,
    qrange: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Clipping range ``lo <= 0 <= hi`` per group (0 inside, so a zero point exists)."""
    lo, hi = np.minimum(mn, 0.0), np.maximum(mx, 0.0)
    if method is ScaleMethod.PERCENTILE:
        q = np.percentile(V, [100.0 - percentile, percentile], axis=axes, keepdims=True)
        lo = np.minimum(q[0].astype(np.float64), 0.0)
        hi = np.maximum(q[1].astype(np.float64), 0.0)
    elif method is ScaleMethod.MEANSTD:
        mean = np.mean(V, axis=axes, keepdims=True, dtype=np.float64)
        std = np.std(V, axis=axes, keepdims=True, dtype=np.float64)
        lo = np.minimum(np.maximum(mn, mean - k_std * std), 0.0)
        hi = np.maximum(np.minimum(mx, mean + k_std * std), 0.0)
    elif method is ScaleMethod.MSE:
        r = _mse_search_asym(V, axes, lo, hi, qrange)
        lo, hi = lo * r, hi * r
    elif method is not ScaleMethod.ABSMAX:  # pragma: no cover
        raise LowbitError(f"scale method {method.value} does not apply here")
    empty = (hi - lo) <= 0
    return np.where(empty, np.minimum(mn, 0.0), lo), np.where(empty, np.maximum(mx, 0.0), hi)


def meanabs(V: np.ndarray, axes: tuple[int, ...], ternary: bool) -> tuple[np.ndarray, np.ndarray]:
    """(scale, threshold) of BNN/XNOR-Net (binary) or TWN (ternary) per group.

    Binary: scale = mean|x| (XNOR-Net, Rastegari et al. 2016), threshold 0 (sign).
    Ternary: threshold = 0.7·mean|x|, scale = mean of |x| over the values above it
    (TWN, Li & Liu 2016); a group with nothing above the threshold gets scale 1.
    """
    a = np.abs(V)
    m = np.mean(a, axis=axes, keepdims=True, dtype=np.float64)
    if not ternary:
        return m, np.zeros_like(m)
    delta = TWN_THRESHOLD * m
    above = a > delta.astype(a.dtype)
    count = np.sum(above, axis=axes, keepdims=True)
    total = np.sum(np.where(above, a, 0), axis=axes, keepdims=True, dtype=np.float64)
    scale = np.where(count > 0, total / np.maximum(count, 1), 1.0)
    return scale, delta


# ---- MSE-optimal clipping ----------------------------------------------------------


def _mse_search(
    V: np.ndarray, axes: tuple[int, ...], amax: np.ndarray, quantizer: Any, qmax: float
) -> np.ndarray:
    """The ratio r of absmax (from ``MSE_RATIOS``) minimising sum (x - Q_r(x))^2, per group.

    ``quantizer(t)`` rounds scaled values to the element grid (saturating); the search
    uses it for every ratio, vectorised over all groups at once.
    """
    Vf = V.astype(np.float32, copy=False)
    best = np.full(amax.shape, np.inf)
    best_c = amax.copy()
    for r in MSE_RATIOS:
        c = amax * r
        s = np.where(c > 0, c / qmax, 1.0).astype(np.float32)
        err = Vf - quantizer(Vf / s) * s
        e = np.sum(np.square(err, dtype=np.float32), axis=axes, keepdims=True, dtype=np.float64)
        better = e < best
        best = np.where(better, e, best)
        best_c = np.where(better, c, best_c)
    return best_c


def _mse_search_asym(
    V: np.ndarray,
    axes: tuple[int, ...],
    lo: np.ndarray,
    hi: np.ndarray,
    qrange: tuple[int, int],
) -> np.ndarray:
    qmin, qmax = qrange
    Vf = V.astype(np.float32, copy=False)
    best = np.full(lo.shape, np.inf)
    best_r = np.ones(lo.shape)
    for r in MSE_RATIOS:
        span = (hi - lo) * r
        s = np.where(span > 0, span / (qmax - qmin), 1.0)
        zp = np.clip(np.rint(qmin - lo * r / s), qmin, qmax).astype(np.float32)
        s32 = s.astype(np.float32)
        q = np.clip(np.rint(Vf / s32) + zp, qmin, qmax)
        err = Vf - (q - zp) * s32
        e = np.sum(np.square(err), axis=axes, keepdims=True, dtype=np.float64)
        better = e < best
        best = np.where(better, e, best)
        best_r = np.where(better, r, best_r)
    return best_r


def grid_quantizer(fmt: Format, qrange: tuple[int, int] | None = None) -> Any:
    """A fast nearest-value rounding onto ``fmt``'s grid for the MSE search (not exact
    at ties; the final codes always come from the exact codec)."""
    if fmt.kind == "int":
        lo, hi = qrange if qrange is not None else (fmt.min, fmt.max)
        return lambda t: np.clip(np.rint(t), lo, hi)
    grid = fmt.values().astype(np.float32)
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)

    def q(t: np.ndarray) -> np.ndarray:
        return grid[np.searchsorted(mids, t)]

    return q
