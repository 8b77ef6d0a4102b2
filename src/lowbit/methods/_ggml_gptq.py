"""GPTQ onto llama.cpp's block types (Q4_K, Q6_K, IQ4_XS, Q5_0 ...): the target, the quantizer
``lowbit.methods.gptq``'s column loop drives, and the result (the block bytes).

When the loop fixes a (super-)block (at its first column without act-order; all blocks up
front, from the weights before any update, with act-order ``static``), llama.cpp's own scale
search (:func:`lowbit.ggml.grids.fit_block`) runs on the block's values at that moment, with
an importance vector: the user's importance matrix when one is given (llama-quantize's
meaning, often from far more text than GPTQ's calibration), else the diagonal of the layer's
Hessian (``2/n * sum x_j^2``: llama.cpp's importance matrix, sums over counts, up to the factor
2, computed on the same inputs as the Hessian). Each column is then rounded as llama.cpp's
final pass rounds it on that grid (:func:`lowbit.ggml.grids.round_columns`) and its error moves
on as GPTQ moves it. With a diagonal Hessian no error moves, and the bytes are
llama-quantize's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.ggml import blocks, grids, legacy_blocks
from lowbit.methods._iq_gptq import IQ_TYPES

__all__ = ["GgmlQuantized", "GgmlTarget"]


@dataclass(frozen=True, eq=False)
class GgmlTarget:
    """A llama.cpp block type as the grid GPTQ rounds a weight onto.

    Attributes:
        qtype: a type of :data:`lowbit.ggml.grids.GPTQ_TYPES` (``"Q4_K"``) or of
            :data:`lowbit.methods._iq_gptq.IQ_TYPES` (``"IQ2_XXS"``, ``"IQ1_S"``: vector codes,
            quantized by :func:`lowbit.methods._iq_gptq.solve_lattice`).
        importance: the importance vector (one weight per input column), or None.
        hessian_importance: without ``importance``, use the Hessian's diagonal as one
            (default); False: llama.cpp's search without importance.
    """

    qtype: str
    importance: np.ndarray | None = field(default=None, repr=False)
    hessian_importance: bool = True

    def __post_init__(self) -> None:
        name = blocks.ggml_type(self.qtype).name
        if name not in grids.GPTQ_TYPES and name not in IQ_TYPES:
            raise LowbitError(
                f"GPTQ rounds onto {', '.join(grids.GPTQ_TYPES + IQ_TYPES)}; {name} is "
                "not one of them"
            )
        object.__setattr__(self, "qtype", name)

    @property
    def label(self) -> str:
        """The type's name, as tables print a scheme's label."""
        return self.qtype

    @property
    def lattice(self) -> bool:
        """Whether the type is an i-quant below 4 bits (vector codes: :mod:`lowbit.methods._iq_gptq`)."""
        return self.qtype in IQ_TYPES

    @property
    def block(self) -> int:
        """Values per (super-)block: the columns one grid spans."""
        return blocks.TYPES[self.qtype].block

    def key(self) -> tuple[Any, ...]:
        """Equal for targets one loop can quantize together (stacked rows)."""
        im = None if self.importance is None else np.asarray(self.importance).tobytes()
        return ("ggml", self.qtype, im, self.hessian_importance)

    def resolved(self, H: np.ndarray) -> GgmlTarget:
        """This target with the importance it uses on a layer of Hessian ``H``."""
        if self.importance is not None or not self.hessian_importance:
            return self
        diag = np.diagonal(H).astype(np.float32)
        return GgmlTarget(self.qtype, diag, False)

    def check(self, cols: int) -> None:
        if cols % self.block:
            raise LowbitError(
                f"{self.qtype} stores rows in blocks of {self.block} values; rows of {cols} "
                "are not a multiple"
            )
        if self.importance is not None and np.asarray(self.importance).size != cols:
            raise LowbitError(
                f"the importance vector has {np.asarray(self.importance).size} values; the "
                f"weight has {cols} columns"
            )

    def rtn(self, W: np.ndarray, H: np.ndarray) -> np.ndarray:
        """llama.cpp's round-to-nearest of ``W`` (the importance this target uses), decoded."""
        im = self.resolved(H).importance
        data = blocks.quantize(np.asarray(W, np.float32), self.qtype, imatrix=im)
        return blocks.dequantize(data, self.qtype)


@dataclass(frozen=True)
class GgmlQuantized:
    """A weight GPTQ quantized onto a llama.cpp block type: its GGUF bytes.

    Attributes:
        qtype: the block type.
        data: uint8 ``(rows, row bytes)``, the tensor's bytes as a GGUF stores them.
        shape: the weight's shape ``(rows, columns)``.
    """

    qtype: str
    data: np.ndarray
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        """Stored bytes."""
        return int(self.data.nbytes)

    def dequantize(self, dtype: Any = np.float32) -> np.ndarray:
        """The values ggml decodes, as ``dtype``."""
        return blocks.dequantize(self.data, self.qtype).astype(dtype).reshape(self.shape)

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The bytes and what names them (as ``QuantizedTensor.to_arrays``), for spilling."""
        return {"data": self.data}, {"ggml_type": self.qtype, "shape": list(self.shape)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> GgmlQuantized:
        """The inverse of :meth:`to_arrays`."""
        rows, cols = meta["shape"]
        return cls(str(meta["ggml_type"]), arrays["data"], (int(rows), int(cols)))


class _GgmlQuantizer:
    """The grid of each block of a weight, fixed by ``fit_group``, and its column rounding
    (the interface ``lowbit.methods.gptq``'s loop drives, as ``_Quantizer``'s)."""

    fmt = SimpleNamespace(code_dtype=np.int16)

    def __init__(self, target: GgmlTarget, W: np.ndarray) -> None:
        cols = W.shape[1]
        target.check(cols)
        self.target = target
        self.qtype = target.qtype
        self.group = target.block
        self.n_groups = cols // self.group
        self.cols = cols
        self.fits: list[dict[str, Any] | None] = [None] * self.n_groups
        self.importance = (
            None if target.importance is None else np.asarray(target.importance, np.float32)
        )
        # Q4_0/Q5_0/Q4_1/Q5_1 weight importance by the mean square of the whole row: of the
        # weights as GPTQ starts on them (llama.cpp's, when nothing moves)
        self.sigma2 = None
        if self.importance is not None and self.qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
            self.sigma2 = legacy_blocks.row_sigma2(W.astype(np.float32))

    def span(self, k: int) -> tuple[int, int]:
        """Columns of block ``k``."""
        return k * self.group, (k + 1) * self.group

    def fit_group(self, k: int, values: np.ndarray) -> None:
        """Fix block ``k``'s grid from its current values ``[rows, block]``."""
        a, b = self.span(k)
        im = None if self.importance is None else self.importance[a:b]
        self.fits[k] = grids.fit_block(self.qtype, values, im, self.sigma2)

    def round(self, w: np.ndarray, k: int, col: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(stored codes, decoded float64 values) of column ``col`` ``w [rows]`` of block ``k``."""
        fit = self.fits[k]
        assert fit is not None
        c, v = grids.round_columns(self.qtype, fit, col - k * self.group, w[:, None])
        return c[:, 0].astype(np.int16), v[:, 0].astype(np.float64)

    def rows(self, a: int, b: int) -> _GgmlQuantizer:
        """The same grids for rows ``a .. b`` only."""
        part = object.__new__(_GgmlQuantizer)
        part.__dict__.update(self.__dict__)
        part.fits = [None if f is None else grids.slice_rows(f, a, b) for f in self.fits]
        part.sigma2 = None if self.sigma2 is None else self.sigma2[a:b]
        return part

    def result(self, codes: np.ndarray, shape: tuple[int, int]) -> GgmlQuantized:
        """The block bytes of ``codes [rows, cols]`` on these grids."""
        parts = []
        for k, fit in enumerate(self.fits):
            assert fit is not None
            a, b = self.span(k)
            parts.append(grids.pack_block(self.qtype, fit, codes[:, a:b]))
        data = np.ascontiguousarray(np.concatenate(parts, axis=1))
        blocks.check_scales(data, self.qtype)
        return GgmlQuantized(self.qtype, data, (int(shape[0]), int(shape[1])))
