"""SmoothQuant: move activation outliers into the weights before W8A8 quantization.

Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large
Language Models" (ICML), Section 4. With per-token activation quantization a few input channels
with huge values (outliers) set every token's scale and flatten the rest; dividing input
channel ``j`` by

    s_j = max|X_j|^α / max|W_j|^(1 - α)

(``max|W_j|`` over every layer reading that input) and multiplying the weights' column ``j`` by
``s_j`` makes the activations easier to quantize and the weights a little harder, ``α`` setting
the balance. The division is folded exactly into the operation before
(``lowbit.methods.folds``). ``α`` is given or chosen from a grid on calibration rows ``X``: the
point whose simulated layers (activations ``A`` as the layers will run them: per token with
:func:`lowbit.quantize_dynamic`, as ``lowbit eval --w8a8`` simulates them, or in groups of a
token's values as ``lowbit eval --act fp8_block|mxfp4|nvfp4`` does, NVFP4's global scale from
the smoothed calibration rows' maximum as a calibrated static scale is; weights with the
layers' own schemes) give the least output error

    sum over the group's layers of ||X W^T - A(X / s) Q(W * s)^T||² / ||X W^T||²,

with "no smoothing" (``s = 1``) always among the candidates, so the chosen scales never make
the calibration error worse. The paper smooths for W8A8; with 4-bit activations (NVFP4,
MXFP4) per-group scales already absorb much of an outlier's damage, and the search says per
layer group whether smoothing still helps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.methods.awq import ScaleSearch, _count, _deq, _unit
from lowbit.methods.gptq import _as_scheme
from lowbit.plans.rules import activation_format
from lowbit.quant.scheme import Scheme
from lowbit.quant.tensor import quantize_dynamic

__all__ = ["GROUPED_ACTIVATIONS", "Simulate", "SmoothQuant", "smooth_scales", "smoothquant_search"]


@dataclass(frozen=True, kw_only=True)
class SmoothQuant:
    """SmoothQuant's settings.

    Args:
        alpha: the migration strength; None (default) chooses it per layer group from
            ``grid`` points on calibration data.
        grid: ``α`` values tried are ``i / grid`` for ``i = 1 .. grid - 1``, and no smoothing.
        activations: the activations the layers will run with: a per-token format
            (``int8``, ``fp8_e4m3``) or a grouped mode of ``lowbit eval --act``
            (``fp8_block``, ``mxfp4``, ``nvfp4``).
        rows: calibration input rows kept per layer group for the search.

    Raises:
        LowbitError: ``alpha`` outside [0, 1], ``grid`` < 2, ``rows`` < 1, activations
            neither a per-token format nor a grouped mode.
    """

    alpha: float | None = None
    grid: int = 20
    activations: str = "int8"
    rows: int = 1024

    def __post_init__(self) -> None:
        if self.alpha is not None:
            object.__setattr__(self, "alpha", _unit(self.alpha, "alpha"))
        _count(self.grid, "grid", 2)
        _count(self.rows, "rows", 1)
        object.__setattr__(self, "activations", _activations(self.activations))

    @property
    def name(self) -> str:
        """``smoothquant``: the method's name in tables and manifests."""
        return "smoothquant"

    def alphas(self) -> list[float | None]:
        """The candidates: None (no smoothing) then the ``α`` values, or the fixed ``α``."""
        if self.alpha is not None:
            return [self.alpha]
        return [None, *(i / self.grid for i in range(1, self.grid))]

    def describe(self) -> str:
        """A short label, e.g. ``smoothquant (α 0.8, int8 activations)``."""
        a = f"α {self.alpha:g}" if self.alpha is not None else f"α grid {self.grid}"
        return f"smoothquant ({a}, {self.activations} activations)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able settings with the method's name."""
        return {
            "method": "smoothquant",
            "alpha": self.alpha,
            "grid": self.grid,
            "activations": self.activations,
            "rows": self.rows,
        }


#: ``lowbit eval --act`` modes that quantize groups of a token's values (the others are per
#: token, as ``activation_format``'s formats).
GROUPED_ACTIVATIONS = ("fp8_block", "mxfp4", "nvfp4")


def _activations(value: Any) -> str:
    """A per-token format's canonical name, or a grouped ``--act`` mode."""
    key = str(value).strip().lower()
    if key in GROUPED_ACTIVATIONS:
        return key
    try:
        return str(activation_format(key if key != "fp8_token" else "fp8"))
    except LowbitError:
        raise LowbitError(
            f"SmoothQuant's activations {value!r}: a per-token format (int8, fp8_e4m3) or a "
            f"grouped mode ({', '.join(GROUPED_ACTIVATIONS)})"
        ) from None


Simulate = Callable[[np.ndarray, str], np.ndarray]


def _per_token(x: np.ndarray, act: str) -> np.ndarray:
    return quantize_dynamic(x, act).dequantize(np.float32)


def smooth_scales(x_max: Any, w_max: Any, alpha: float) -> np.ndarray:
    """``max|X_j|^α / max|W_j|^(1-α)``, both maxima floored at 1e-5 (the reference code's
    guard against dead channels).

    Args:
        x_max: max ``|x|`` per input channel over the calibration data.
        w_max: max ``|w|`` per input column over the layers reading that input.
        alpha: in [0, 1].
    """
    x = np.maximum(np.asarray(x_max, dtype=np.float64), 1e-5)
    w = np.maximum(np.asarray(w_max, dtype=np.float64), 1e-5)
    return x**alpha / w ** (1.0 - alpha)


def _w8a8_error(
    X: np.ndarray, Ws: Mapping[str, np.ndarray], sch: Mapping[str, Scheme], s: np.ndarray,
    act: str, refs: Mapping[str, np.ndarray], simulate: Simulate,
) -> float:  # fmt: skip
    # float32 products: the search ranks candidates; the reported layer errors are float64
    Xq = simulate((X / s).astype(np.float32), act)
    err = 0.0
    for n, w in Ws.items():
        y = Xq @ _deq(w * s, sch[n]).astype(np.float32).T
        err += float(np.sum((refs[n] - y).astype(np.float64) ** 2))
    return err


def smoothquant_search(
    weights: Mapping[str, Any],
    X: Any,
    x_max: Any,
    schemes: Mapping[str, Scheme | str],
    cfg: SmoothQuant | None = None,
    *,
    expand: Callable[[np.ndarray], np.ndarray] | None = None,
    reduce: Callable[[np.ndarray], np.ndarray] | None = None,
    simulate: Simulate | None = None,
) -> ScaleSearch:
    """SmoothQuant's scales for a group of layers reading one input.

    Args:
        weights: name -> weight ``[out, in]``.
        X: calibration input rows ``[n, in]``.
        x_max: max ``|x|`` per searched channel over all the calibration data.
        schemes: name -> the layer's weight scheme.
        cfg: the settings (default ``SmoothQuant()``).
        expand: searched scales -> the ``in`` input columns (grouped-query heads).
        reduce: per-input-column weight maxima -> per searched channel (the max over the
            columns ``expand`` repeats one scale to).
        simulate: ``(rows, activations) -> rows`` quantized and dequantized as the layers
            run them; needed for grouped activations (``lowbit.models.act_quant
            .fake_quantize_rows``, torch); per-token formats default to
            :func:`lowbit.quantize_dynamic`.

    Returns:
        A :class:`~lowbit.methods.awq.ScaleSearch`: ``alpha`` is -1.0 when no smoothing won;
        errors are relative output errors of the simulated layers (weights and activations
        quantized) on ``X``.

    Raises:
        LowbitError: shapes that do not match, non-finite statistics, grouped activations
            without ``simulate`` or whose group does not divide the input width.
    """
    cfg = SmoothQuant() if cfg is None else cfg
    if simulate is None:
        if cfg.activations in GROUPED_ACTIVATIONS:
            raise LowbitError(
                f"SmoothQuant with {cfg.activations} activations needs their simulation: pass "
                "simulate=lowbit.models.act_quant.fake_quantize_rows"
            )
        simulate = _per_token
    expand = expand or (lambda s: s)
    reduce = reduce or (lambda v: v)
    X64 = np.asarray(X, dtype=np.float64)
    Ws = {n: np.asarray(w, dtype=np.float64) for n, w in weights.items()}
    sch = {n: _as_scheme(schemes[n]) for n in Ws}
    if X64.ndim != 2 or any(w.ndim != 2 or w.shape[1] != X64.shape[1] for w in Ws.values()):
        raise LowbitError("SmoothQuant: calibration rows and weights do not share an input width")
    xm = np.asarray(x_max, dtype=np.float64)
    if not (np.all(np.isfinite(X64)) and np.all(np.isfinite(xm))):
        raise LowbitError("SmoothQuant needs finite calibration statistics")
    w_max = reduce(np.max(np.stack([np.abs(w).max(axis=0) for w in Ws.values()]), axis=0))
    refs = {n: (X64 @ w.T).astype(np.float32) for n, w in Ws.items()}
    base = sum(float(np.sum(r**2)) for r in refs.values()) or 1.0
    ones = np.ones_like(xm)
    tried: dict[float, float] = {}
    best: tuple[float, float, np.ndarray] | None = None
    before = None
    for a in cfg.alphas():
        s = ones if a is None else smooth_scales(xm, w_max, a)
        if not (np.all(np.isfinite(s)) and np.all(s > 0)):
            continue
        err = _w8a8_error(X64, Ws, sch, expand(s), cfg.activations, refs, simulate) / base
        key = -1.0 if a is None else float(a)
        tried[key] = err
        if a is None:
            before = err
        if best is None or err < best[1]:
            best = (key, err, s)
    if best is None:
        raise LowbitError("SmoothQuant: no finite scales for any α")
    if before is None:
        before = _w8a8_error(X64, Ws, sch, expand(ones), cfg.activations, refs, simulate) / base
    return ScaleSearch(best[2], best[0], before, best[1], tried)


def parse_alpha(text: str) -> float | None:
    """``--smooth``'s value: ``search`` (None) or a number in [0, 1].

    Raises:
        LowbitError: anything else.
    """
    if text.strip().lower() == "search":
        return None
    try:
        alpha = float(text)
    except ValueError:
        raise LowbitError(f"--smooth takes a number in [0, 1], got {text!r}") from None
    if not 0.0 <= alpha <= 1.0:
        raise LowbitError(f"--smooth takes a number in [0, 1], got {text!r}")
    return alpha
