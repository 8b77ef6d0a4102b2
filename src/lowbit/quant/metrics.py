"""Error metrics of a quantized tensor against the original: what quantization cost."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.tensor import _as_input


def _values(a: Any) -> np.ndarray:
    if isinstance(a, QuantizedTensor):
        return np.asarray(
            a.dequantize(np.float64) if not a._source_torch else a.dequantize(np.float64).numpy()
        )
    arr, _ = _as_input(a)
    return arr.astype(np.float64, copy=False)


def error(x: Any, qt_or_array: Any) -> dict[str, float]:
    """How far a quantized tensor (or any approximation) is from ``x``.

    Args:
        x: the original values (array-like or torch tensor).
        qt_or_array: a :class:`~lowbit.quant.quantized_tensor.QuantizedTensor` (dequantized exactly, in
            float64) or an array of the same shape.

    Returns:
        ``mse`` mean squared error; ``rmse``; ``sqnr_db`` = 10·log10(Σx² / Σ(x-x̂)²)
        (inf when exact); ``max_abs`` largest |x - x̂|; ``rel_fro`` = ‖x - x̂‖_F / ‖x‖_F;
        ``cosine`` similarity of x and x̂ as vectors. Computed in float64 over finite
        entries of x (NaN/inf positions are skipped).

    Raises:
        LowbitError: shapes differ, or the input is empty.
    """
    a = _values(x)
    b = _values(qt_or_array)
    if a.shape != b.shape:
        raise LowbitError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.size == 0:
        raise LowbitError("cannot measure the error of an empty tensor")
    keep = np.isfinite(a)
    if not keep.all():
        a, b = a[keep], b[keep]
    d = a - b
    sig = float(np.dot(a.ravel(), a.ravel()))
    noise = float(np.dot(d.ravel(), d.ravel()))
    n = a.size
    mse = noise / n if n else math.nan
    nb = float(np.dot(b.ravel(), b.ravel()))
    if noise == 0:
        sqnr = math.inf
    elif sig == 0:
        sqnr = -math.inf
    else:
        sqnr = 10 * math.log10(sig / noise)
    cos = (
        float(np.dot(a.ravel(), b.ravel()) / math.sqrt(sig * nb))
        if sig > 0 and nb > 0
        else (1.0 if sig == 0 and nb == 0 else 0.0)
    )
    return {
        "mse": mse,
        "rmse": math.sqrt(mse),
        "sqnr_db": sqnr,
        "max_abs": float(np.max(np.abs(d))) if n else math.nan,
        "rel_fro": math.sqrt(noise / sig) if sig > 0 else (0.0 if noise == 0 else math.inf),
        "cosine": cos,
    }
