"""GPTQ onto MLX's affine grid: the target, the quantizer GPTQ's loop drives, the result.

The result is MLX's uint32 words, scales and biases.

When the loop reaches a group's first column (all groups up front, from the weights before any
update, with act-order ``static``), the group's grid is MLX's own (``lowbit.quant.mlx``: the
edge rule on the group's values at that moment, rounded to the model dtype, in float32); each
column is then coded as MLX codes it (``rint((w - bias) / scale)`` with the float32 scale)
and its error against the value MLX will decode (``q * scale + bias`` in the model dtype)
moves on as GPTQ moves it. With a diagonal Hessian nothing moves, and the bytes are
``mx.quantize``'s.

With ``search`` (``--scale-method mse``), each group's scale and bias are searched instead:
from the edge rule's, then for inverse scales around ``(2^bits - 1) / (max - min)`` (21
candidates) the codes of the group, and for each the weighted least-squares scale and bias
of those codes (weights: the importance, by default the Hessian's diagonal, the input
energy of each column), keeping the pair of least weighted error once cast to the model
dtype. MLX decodes any scale and bias; only the choice differs from ``mx.quantize``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from lowbit._arrays import ml_dtype
from lowbit.errors import LowbitError
from lowbit.quant import mlx as Q

__all__ = ["MLXQuantized", "MLXTarget"]

_DTYPES = ("float16", "bfloat16", "float32")


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtype("bfloat16")) if name == "bfloat16" else np.dtype(name)


@dataclass(frozen=True)
class MLXTarget:
    """MLX's affine grid as the grid GPTQ rounds a weight onto.

    Attributes:
        bits: 1, 2, 3, 4, 5, 6 or 8.
        group_size: 32, 64 or 128.
        dtype: the model dtype scales and biases are stored in (``float16``, ``bfloat16``,
            ``float32``).
        search: search each group's scale and bias for the least importance-weighted error
            (module docstring) instead of MLX's edge rule.
        importance: with ``search``, one weight per input column (default: the Hessian's
            diagonal).
    """

    bits: int = 4
    group_size: int = 64
    dtype: str = "float16"
    search: bool = False
    importance: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        Q.check_params("affine", self.group_size, self.bits)
        if self.dtype not in _DTYPES:
            raise LowbitError(f"MLX model dtype {self.dtype!r}; allowed: {', '.join(_DTYPES)}")

    @property
    def label(self) -> str:
        return f"mlx affine {self.bits}-bit g{self.group_size}" + (" mse" if self.search else "")

    @property
    def block(self) -> int:
        return self.group_size

    def key(self) -> tuple[Any, ...]:
        """Equal for targets one loop can quantize together (stacked rows)."""
        im = None if self.importance is None else np.asarray(self.importance).tobytes()
        return ("mlx", self.bits, self.group_size, self.dtype, self.search, im)

    def resolved(self, H: np.ndarray) -> MLXTarget:
        """This target with the importance its search uses on a layer of Hessian ``H``."""
        if not self.search or self.importance is not None:
            return self
        return replace(self, importance=np.diagonal(H).astype(np.float32))

    def check(self, cols: int) -> None:
        if cols % self.group_size:
            raise LowbitError(
                f"MLX groups of {self.group_size} do not divide rows of {cols} values"
            )

    def rtn(self, W: np.ndarray, H: np.ndarray | None = None) -> np.ndarray:
        """``mx.quantize``'s round to nearest of ``W`` (cast to the model dtype), decoded."""
        return self.quantize(W).dequantize(np.float32)

    def quantize(self, W: np.ndarray) -> MLXQuantized:
        """``mx.quantize`` of ``W`` cast to the model dtype (AWQ's scaled, clipped weights)."""
        w = np.asarray(W, np.float32).astype(_np_dtype(self.dtype))
        words, scales, biases = Q.quantize(w, group_size=self.group_size, bits=self.bits)
        return MLXQuantized(words, scales, biases, self.bits, self.group_size)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MLXQuantized:
    """A weight quantized onto MLX's affine grid: the arrays an MLX folder stores.

    Attributes:
        words: uint32 ``(rows, cols * bits / 32)``.
        scales, biases: ``(rows, cols / group_size)`` in the model dtype.
        bits, group_size: the grid.
    """

    words: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.words.shape[0]), int(self.words.shape[1]) * 32 // self.bits)

    @property
    def nbytes(self) -> int:
        return int(self.words.nbytes + self.scales.nbytes + self.biases.nbytes)

    def dequantize(self, dtype: Any = np.float32) -> np.ndarray:
        """The values ``mx.dequantize`` gives, as ``dtype``."""
        out = Q.dequantize(
            self.words, self.scales, self.biases, group_size=self.group_size, bits=self.bits
        )
        return out.astype(dtype)

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The arrays and what names them (as ``QuantizedTensor.to_arrays``), for spilling."""
        dt = "bfloat16" if self.scales.dtype == ml_dtype("bfloat16") else self.scales.dtype.name
        arrays = {"words": self.words, "scales": self.scales.view(f"u{self.scales.itemsize}"),
                  "biases": self.biases.view(f"u{self.biases.itemsize}")}  # fmt: skip
        return arrays, {"mlx_affine": [self.bits, self.group_size, dt]}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> MLXQuantized:
        """The inverse of :meth:`to_arrays`."""
        bits, gs, dt = meta["mlx_affine"]
        d = _np_dtype(str(dt))
        return cls(
            arrays["words"], arrays["scales"].view(d), arrays["biases"].view(d), int(bits), int(gs)
        )


class _MLXQuantizer:
    """The grid of each group, fixed by ``fit_group``, and MLX's column coding (the interface
    ``lowbit.methods.gptq``'s loop drives, as ``_Quantizer``'s)."""

    fmt = SimpleNamespace(code_dtype=np.uint8)

    def __init__(self, target: MLXTarget, W: np.ndarray) -> None:
        rows, cols = W.shape
        target.check(cols)
        self.target = target
        self.dt = _np_dtype(target.dtype)
        self.group = target.group_size
        self.n_groups = cols // self.group
        self.cols = cols
        self.scale32 = np.ones((rows, self.n_groups), dtype=np.float32)
        self.bias32 = np.zeros((rows, self.n_groups), dtype=np.float32)

    def span(self, k: int) -> tuple[int, int]:
        return k * self.group, (k + 1) * self.group

    def _t32(self, x: np.ndarray) -> np.ndarray:
        """Values as the model dtype holds them, in float32."""
        return np.asarray(x, np.float32).astype(self.dt).astype(np.float32)

    def fit_group(self, k: int, values: np.ndarray) -> None:
        """Fix group ``k``'s grid from its current values ``[rows, group]``."""
        x = self._t32(values)
        s, b = Q.affine_params(x, self.target.bits)
        if self.target.search:
            imp = self.target.importance
            a, z = self.span(k)
            w = np.ones(self.group, np.float32) if imp is None else np.asarray(imp)[a:z]
            s, b = self._search(x, np.asarray(w, np.float32), s, b)
        self.scale32[:, k] = s
        self.bias32[:, k] = b

    def _error(self, x: np.ndarray, w: np.ndarray, s: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Each row's weighted squared error of MLX's coding and decoding on grid (s, b)."""
        dt = self.dt
        safe = np.where(s == 0, np.float32(1), s)
        q = Q.affine_codes(x, safe[:, None], b[:, None], self.target.bits).astype(dt)
        v = ((q * s.astype(dt)[:, None]).astype(dt) + b.astype(dt)[:, None]).astype(np.float32)
        return ((v - x) ** 2 * w).sum(axis=1)

    def _search(
        self, x: np.ndarray, w: np.ndarray, s0: np.ndarray, b0: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The least weighted-error (scale, bias) of each row of ``x [rows, group]``, from the
        edge rule's ``(s0, b0)`` and 21 least-squares refits (module docstring)."""
        n = float(2**self.target.bits - 1)
        w = np.maximum(w, 0).astype(np.float32)
        if not np.any(w > 0):
            w = np.ones_like(w)
        best_s, best_b = s0.copy(), b0.copy()
        best = self._error(x, w, best_s, best_b)
        lo = x.min(axis=1, keepdims=True)
        span = np.maximum(x.max(axis=1, keepdims=True) - lo, np.float32(1e-12))
        sw = w.sum()
        sx = (x * w).sum(axis=1)
        for i in range(21):
            inv = (n - 1.0 + 0.1 * i) / span  # from one level narrower to one wider
            q = np.clip(np.rint((x - lo) * inv), 0, n)
            sq, sqq, sqx = (q * w).sum(axis=1), (q * q * w).sum(axis=1), (q * x * w).sum(axis=1)
            det = sw * sqq - sq * sq
            ok = det > 0
            det = np.where(ok, det, 1)
            s = np.where(ok, (sw * sqx - sq * sx) / det, 0).astype(np.float32)
            b = np.where(ok, (sx - s * sq) / sw, 0).astype(np.float32)
            s, b = self._t32(s), self._t32(b)  # as stored
            ok &= s != 0
            err = np.where(ok, self._error(x, w, s, b), np.inf)
            better = err < best
            best = np.where(better, err, best)
            best_s = np.where(better, s, best_s)
            best_b = np.where(better, b, best_b)
        return best_s.astype(np.float32), best_b.astype(np.float32)

    def round(self, w: np.ndarray, k: int, col: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(codes, decoded float64 values) of one column ``w [rows]`` of group ``k``."""
        s, b = self.scale32[:, k], self.bias32[:, k]
        codes = Q.affine_codes(self._t32(w), s, b, self.target.bits)
        dt = self.dt
        v = (codes.astype(dt) * s.astype(dt)).astype(dt) + b.astype(dt)
        return codes, v.astype(dt).astype(np.float64)

    def rows(self, a: int, b: int) -> _MLXQuantizer:
        part = object.__new__(_MLXQuantizer)
        part.__dict__.update(self.__dict__)
        part.scale32 = self.scale32[a:b]
        part.bias32 = self.bias32[a:b]
        return part

    def result(self, codes: np.ndarray, shape: tuple[int, int]) -> MLXQuantized:
        t = self.target
        return MLXQuantized(
            Q.pack_rows(np.ascontiguousarray(codes, dtype=np.uint8), t.bits),
            self.scale32.astype(self.dt),
            self.bias32.astype(self.dt),
            t.bits,
            t.group_size,
        )
