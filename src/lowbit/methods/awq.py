"""AWQ: per-input-channel scales that protect the weights of the inputs that matter, for any scheme.

Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration" (MLSys), Section 3. A group of linear layers reading one input ``X [n, in]``
(q/k/v, gate/up) is quantized as ``Q(W * s) / s``: the input columns are multiplied by ``s``
before rounding and the input divided by ``s`` (folded exactly into the operation before,
``lowbit.methods.folds``), so channels with large activations lose relatively less. The scales
are ``s = mean|x|^α`` per input channel, normalised by ``sqrt(max s · min s)``; ``α`` is the
point of a grid over ``[0, 1)`` (``i / 20`` by default, as AWQ's reference code; ``α = 0`` gives
``s = 1``, round to nearest) whose quantized group has the least output error

    sum over the group's layers of  tr(ΔW H ΔW^T) / tr(W H W^T),   ΔW = W - Q(W * s) / s,

with ``H = 2 X^T X / n`` the Hessian GPTQ uses (``lowbit.calibration.data``): exactly the
mean squared error of the layers' outputs on the calibration inputs, over every token seen,
without keeping the inputs. The optional clipping search (AWQ's ``auto_clip``) shrinks each
group's range to ``r · max|w|`` (asymmetric: ``[r · min, r · max]``) for ``r`` from 1 down to
``1 - max_shrink``, choosing ``r`` per output row and group by that group's output error
``Δw_g H_gg Δw_g^T``; the clipped weights are kept only where the whole layer's output error
falls.

``Q`` is :func:`lowbit.quantize` with the layer's own scheme, so AWQ works for every format and
granularity lowbit quantizes to (integer sym/asym, FP8/FP6/FP4, NF4, MX, GGUF grids); clipping
needs per-tensor, per-output-channel or input-axis groups (others are not clipped). A layer's
"scheme" may also be MLX's affine grid (:class:`~lowbit.methods._mlx_gptq.MLXTarget`): ``Q`` is
then ``mx.quantize`` in the model dtype, clipped asymmetrically per group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.methods._mlx_gptq import MLXTarget
from lowbit.methods.gptq import _as_scheme
from lowbit.quant.scheme import Granularity, Scheme
from lowbit.quant.tensor import quantize

__all__ = ["AWQ", "ScaleSearch", "awq_clip", "awq_search", "output_error", "rounded"]


def _unit(value: Any, what: str) -> float:
    v = float(value)
    if not math.isfinite(v) or not 0.0 <= v <= 1.0:
        raise LowbitError(f"{what} must be in [0, 1], got {value!r}")
    return v


def _count(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise LowbitError(f"{what} must be an integer >= {low}, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class AWQ:
    """AWQ's settings: a method of quantizing layer groups given their input statistics.

    Args:
        grid: points of the ``α`` grid ``i / grid`` (20, as AWQ's reference code).
        alpha: a fixed ``α`` instead of the search (``0`` with ``clip=False`` is round to
            nearest, code for code).
        clip: search a clipping ratio per output row and group (default on).
        clip_grid: clipping ratios are ``1 - i / clip_grid``.
        max_shrink: the smallest ratio tried is ``1 - max_shrink`` (0.5 as AWQ's code).

    Raises:
        LowbitError: ``grid`` or ``clip_grid`` < 1, ``alpha`` or ``max_shrink`` outside [0, 1].
    """

    grid: int = 20
    alpha: float | None = None
    clip: bool = True
    clip_grid: int = 20
    max_shrink: float = 0.5

    def __post_init__(self) -> None:
        _count(self.grid, "grid", 1)
        _count(self.clip_grid, "clip_grid", 1)
        if self.alpha is not None:
            object.__setattr__(self, "alpha", _unit(self.alpha, "alpha"))
        object.__setattr__(self, "max_shrink", _unit(self.max_shrink, "max_shrink"))
        object.__setattr__(self, "clip", bool(self.clip))

    @property
    def name(self) -> str:
        """``awq``: the method's name in tables and manifests."""
        return "awq"

    def alphas(self) -> np.ndarray:
        """The ``α`` values tried: the fixed one, or ``i / grid`` for ``i = 0 .. grid - 1``
        (AWQ's reference grid: 0, 0.05, ..., 0.95)."""
        if self.alpha is not None:
            return np.array([self.alpha])
        return np.arange(self.grid) / self.grid

    def ratios(self) -> np.ndarray:
        """The clipping ratios tried (1 first)."""
        n = max(1, round(self.max_shrink * self.clip_grid))
        return 1.0 - np.arange(n) / self.clip_grid

    def describe(self) -> str:
        """A short label, e.g. ``awq (α grid 20, clipping)``."""
        a = f"α {self.alpha:g}" if self.alpha is not None else f"α grid {self.grid}"
        return f"awq ({a}, {'clipping' if self.clip else 'no clipping'})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able settings with the method's name."""
        return {
            "method": "awq",
            "grid": self.grid,
            "alpha": self.alpha,
            "clip": self.clip,
            "clip_grid": self.clip_grid,
            "max_shrink": self.max_shrink,
        }


@dataclass(frozen=True)
class ScaleSearch:
    """The scales a search chose and what they gained.

    Attributes:
        scales: one positive scale per searched channel.
        alpha: the ``α`` chosen.
        before: the group's relative output error with ``s = 1`` (round to nearest).
        after: with the chosen scales.
        tried: ``α`` -> error, every point tried.
    """

    scales: np.ndarray
    alpha: float
    before: float
    after: float
    tried: dict[float, float]


def _deq(W: np.ndarray, scheme: Scheme | MLXTarget) -> np.ndarray:
    if isinstance(scheme, MLXTarget):  # MLX's affine grid, rounded as mx.quantize rounds
        return scheme.rtn(W).astype(np.float64)
    return quantize(np.asarray(W, dtype=np.float32), scheme).dequantize(np.float64)


def rounded(W: Any, scheme: Any) -> Any:
    """``W`` quantized with a layer's scheme, or onto its MLX grid (an
    :class:`~lowbit.methods._mlx_gptq.MLXTarget`: MLX's words, scales and biases); either has
    ``dequantize(dtype)``."""
    if isinstance(scheme, MLXTarget):
        return scheme.quantize(W)
    return quantize(np.asarray(W, dtype=np.float32), scheme)


def output_error(W: np.ndarray, W_hat: np.ndarray, H: np.ndarray) -> float:
    """``tr((W - Ŵ) H (W - Ŵ)^T)``: the layer-output error on inputs with Hessian ``H``."""
    D = np.asarray(W, dtype=np.float64) - np.asarray(W_hat, dtype=np.float64)
    return float(np.einsum("ij,ij->", D @ H, D))


def _error32(W: np.ndarray, W_hat: np.ndarray, H32: np.ndarray) -> float:
    """:func:`output_error` with float32 products (summed in float64)."""
    D = (W - W_hat).astype(np.float32)
    return float(np.einsum("ij,ij->", (D @ H32).astype(np.float64), D.astype(np.float64)))


def awq_search(
    weights: Mapping[str, Any],
    H: Any,
    mean_abs: Any,
    schemes: Mapping[str, Scheme | str],
    cfg: AWQ | None = None,
    *,
    expand: Callable[[np.ndarray], np.ndarray] | None = None,
) -> ScaleSearch:
    """AWQ's scale search for a group of layers reading one input.

    Args:
        weights: name -> weight ``[out, in]`` of the layers (all with the same ``in``).
        H: their inputs' Hessian ``[in, in]`` (``2 X^T X / n``).
        mean_abs: mean ``|x|`` per searched channel (``[in]``, or fewer with ``expand``).
        schemes: name -> scheme of each layer.
        cfg: the settings (default ``AWQ()``).
        expand: maps the searched scales onto the ``in`` input columns (grouped-query heads:
            ``lowbit.methods.folds.head_repeat``); default: the identity.

    Returns:
        A :class:`ScaleSearch` (``scales`` as searched, before ``expand``).

    Raises:
        LowbitError: shapes that do not match, a bad scheme, non-finite statistics.
    """
    cfg = AWQ() if cfg is None else cfg
    expand = expand or (lambda s: s)
    H64 = np.asarray(H, dtype=np.float64)
    x = np.asarray(mean_abs, dtype=np.float64)
    if not np.all(np.isfinite(x)) or not np.all(np.isfinite(H64)):
        raise LowbitError("AWQ needs finite calibration statistics")
    Ws = {n: np.asarray(w, dtype=np.float64) for n, w in weights.items()}
    sch = {n: _as_scheme(schemes[n]) for n in Ws}
    for n, w in Ws.items():
        if w.ndim != 2 or H64.shape != (w.shape[1], w.shape[1]):
            raise LowbitError(f"{n}: weight {w.shape} does not match the Hessian {H64.shape}")
    base = sum(output_error(w, np.zeros_like(w), H64) for w in Ws.values()) or 1.0
    H32 = H64.astype(np.float32)  # the search ranks candidates: float32 products suffice
    x = np.maximum(x, 1e-4)
    tried: dict[float, float] = {}
    best: tuple[float, float, np.ndarray] | None = None
    for a in cfg.alphas():
        s = x**a
        s = s / math.sqrt(float(s.max() * s.min()))
        full = expand(s)
        err = sum(_error32(w, _deq(w * full, sch[n]) / full, H32) for n, w in Ws.items())
        err /= base
        tried[float(a)] = err
        if best is None or err < best[1]:
            best = (float(a), err, s)
    assert best is not None
    if 0.0 in tried:
        before = tried[0.0]
    else:
        before = sum(_error32(w, _deq(w, sch[n]), H32) for n, w in Ws.items()) / base
    return ScaleSearch(best[2], best[0], before, best[1], tried)


def _groups(W: np.ndarray, scheme: Scheme | MLXTarget) -> int | None:
    """Columns per clipping group (the whole row for channel/tensor scales); None: the layout
    is not along rows (no clipping)."""
    if isinstance(scheme, MLXTarget):  # groups along the row, an asymmetric grid
        return scheme.group_size
    g = scheme.granularity
    axis = scheme.axis % 2 if scheme.axis is not None else None  # type: ignore[operator]
    if g is Granularity.TENSOR:
        return W.shape[1]
    if g is Granularity.CHANNEL and axis == 0:
        return W.shape[1]
    if g in (Granularity.GROUP, Granularity.BLOCK) and axis == 1:
        return int(scheme.group_size)  # type: ignore[arg-type]
    return None


def _group_errors(D: np.ndarray, H: np.ndarray, size: int) -> np.ndarray:
    """``Δw_g H_gg Δw_g^T`` per output row and column group ``[out, groups]``."""
    cols = D.shape[1]
    out = []
    for a in range(0, cols, size):
        b = min(a + size, cols)
        d = D[:, a:b]
        out.append(np.einsum("ij,ij->i", d @ H[a:b, a:b], d))
    return np.stack(out, axis=1)


def _clamp(W: np.ndarray, r: np.ndarray, size: int, symmetric: bool) -> np.ndarray:
    """``W`` clipped per row and group to ``r`` times its range (``r [out, groups]``)."""
    out = W.copy()
    for k, a in enumerate(range(0, W.shape[1], size)):
        b = min(a + size, W.shape[1])
        g = W[:, a:b]
        rk = r[:, k : k + 1]
        if symmetric:
            m = np.abs(g).max(axis=1, keepdims=True) * rk
            out[:, a:b] = np.clip(g, -m, m)
        else:
            hi = g.max(axis=1, keepdims=True)
            lo = g.min(axis=1, keepdims=True)
            out[:, a:b] = np.clip(g, np.minimum(lo * rk, 0.0), np.maximum(hi * rk, 0.0))
    return out


def awq_clip(
    W: Any, H: Any, scheme: Scheme | MLXTarget | str, cfg: AWQ | None = None
) -> np.ndarray:
    """AWQ's clipping search: ``W`` with each row's groups clipped where that lowers the output
    error of their quantization (per-tensor scales: one ratio for the whole tensor).

    Args:
        W: the weight ``[out, in]`` (already scaled by AWQ, if it is).
        H: its inputs' Hessian ``[in, in]`` (of the scaled inputs).
        scheme: the layer's scheme.
        cfg: the settings (default ``AWQ()``).

    Returns:
        The weight to quantize (float64): ``W`` itself where clipping gains nothing, or with
        ``cfg.clip`` off.
    """
    cfg = AWQ() if cfg is None else cfg
    sch: Scheme | MLXTarget = _as_scheme(scheme)  # type: ignore[arg-type]
    W64 = np.asarray(W, dtype=np.float64)
    H64 = np.asarray(H, dtype=np.float64)
    size = _groups(W64, sch)
    ratios = cfg.ratios()
    if not cfg.clip or size is None or len(ratios) < 2:
        return W64
    ngroups = -(-W64.shape[1] // size)
    ones = np.ones((W64.shape[0], ngroups))
    errs = []
    symmetric = False if isinstance(sch, MLXTarget) else sch.symmetric
    for r in ratios:
        Wc = _clamp(W64, ones * r, size, symmetric)
        errs.append(_group_errors(W64 - _deq(Wc, sch), H64, size))
    E = np.stack(errs)  # [ratios, out, groups]
    if getattr(sch, "granularity", None) is Granularity.TENSOR:
        pick = np.full(ones.shape, int(np.argmin(E.sum(axis=(1, 2)))))
    else:
        pick = np.argmin(E, axis=0)
    clipped = _clamp(W64, ratios[pick], size, symmetric)
    if output_error(W64, _deq(clipped, sch), H64) < output_error(W64, _deq(W64, sch), H64):
        return clipped
    return W64
