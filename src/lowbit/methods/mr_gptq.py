"""MR-GPTQ (arXiv 2509.23202): GPTQ onto an FP4 grid in a block-Hadamard-rotated basis.

A linear layer ``y = x Wᵀ`` is unchanged when its input and weight are both rotated by an
orthogonal ``R``: ``(x R)(W R)ᵀ = x Wᵀ`` (``lowbit.methods.hadamard``; ``R`` block-diagonal,
each block the Hadamard matrix of the scale group's size: 16 for NVFP4, 32 for MXFP4). The
layer's inputs in the rotated basis are ``X' = X R``, so the Hessian of its output error there
is ``H' = 2 X'ᵀ X' / n = Rᵀ H R``. :class:`MRGPTQ` quantizes ``W R`` with GPTQ under ``H'``
(the ordinary lowbit loop: scales chosen from the legal E4M3/E8M0 values by the scheme's own
rule, every column's error pushed onto the columns after it) and returns a
:class:`RotatedTensor`: the codes and scales of ``W R`` (what a consumer that rotates its
inputs online multiplies) and, through :meth:`RotatedTensor.dequantize`, the weight in the
original basis ``Q(W R) Rᵀ`` (what a model that does not rotate its inputs computes with: the
same outputs for unquantized inputs). Weights whose input width the block does not divide are
quantized by plain GPTQ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit.methods.gptq import GPTQ, _as_scheme
from lowbit.methods.hadamard import rotate_rows, rotation_block
from lowbit.quant.scheme import Scheme

__all__ = ["MRGPTQ", "RotatedTensor", "rotate_hessian"]


class RotatedTensor:
    """A weight quantized in a block-Hadamard-rotated basis.

    Attributes:
        rotated: the :class:`~lowbit.quant.quantized_tensor.QuantizedTensor` of ``W R`` (its codes and
            scales are what is stored; a consumer rotates the layer's inputs by the same ``R``).
        block: the Hadamard block ``b`` of ``R``.

    Everything else (``nbytes``, ``numel``, ``shape``, ``scheme`` ...) is the rotated tensor's;
    :meth:`dequantize` returns the weight in the original basis.
    """

    def __init__(self, rotated: Any, block: int) -> None:
        self.rotated = rotated
        self.block = int(block)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["rotated"], name)

    def dequantize(self, dtype: Any = np.float32) -> np.ndarray:
        """``Q(W R) Rᵀ``: the dequantized weight rotated back (``R`` is symmetric and its own
        inverse block by block, so ``Rᵀ = R``)."""
        w = self.rotated.dequantize(np.float64)
        return np.asarray(rotate_rows(w, self.block), dtype=dtype)


def rotate_hessian(H: Any, block: int) -> np.ndarray:
    """``Rᵀ H R`` for the block-diagonal Hadamard ``R`` of ``block`` (float64): the Hessian of
    a layer whose inputs are rotated to ``X R``.

    Raises:
        LowbitError: ``H``'s width not a multiple of ``block``.
    """
    H64 = np.asarray(H, dtype=np.float64)
    HR = rotate_rows(H64, block)  # H R
    out = rotate_rows(np.ascontiguousarray(HR.T), block)  # (H R)ᵀ R = Rᵀ H R (H symmetric)
    return np.ascontiguousarray((out + out.T) / 2)  # symmetric to the last bit


@dataclass(frozen=True, kw_only=True)
class MRGPTQ(GPTQ):
    """GPTQ in a block-Hadamard-rotated basis (MR-GPTQ): the settings of :class:`GPTQ`, the
    rotation block sized to each scheme's scale group (``lowbit.methods.hadamard.rotation_block``).

    Raises:
        LowbitError: as :class:`GPTQ`; at quantization, a scheme without power-of-two groups
            along the input axis.
    """

    @property
    def name(self) -> str:
        """``hadamard+gptq``: the method's name in tables (``lowbit eval --methods``)."""
        return "hadamard+gptq"

    def describe(self) -> str:
        """A short label: GPTQ's, with the rotation."""
        return "block-Hadamard " + super().describe()

    def to_dict(self) -> dict[str, Any]:
        """GPTQ's settings and ``rotation: block-hadamard`` (the block is each scheme's group)."""
        return {**super().to_dict(), "rotation": "block-hadamard"}

    def quantize_shared(
        self, weights: Mapping[str, Any], H: Any, schemes: Mapping[str, Scheme | str]
    ) -> dict[str, Any]:
        """:meth:`GPTQ.quantize_shared` of ``W R`` under ``Rᵀ H R``, per rotation block.

        Returns:
            name -> :class:`RotatedTensor` (or a plain QuantizedTensor where the block does
            not divide the input width).
        """
        plain: dict[str, Any] = {}
        by_block: dict[int, dict[str, Any]] = {}
        for name, W in weights.items():
            scheme = _as_scheme(schemes[name]) if name in schemes else None
            block = rotation_block(scheme) if scheme is not None else 0
            if block and np.shape(W)[-1] % block == 0:
                by_block.setdefault(block, {})[name] = W
            else:
                plain[name] = W
        out: dict[str, Any] = {}
        if plain:
            out.update(super().quantize_shared(plain, H, schemes))
        for block, ws in by_block.items():
            rw = {n: rotate_rows(np.asarray(w, dtype=np.float64), block) for n, w in ws.items()}
            qts = super().quantize_shared(rw, rotate_hessian(H, block), schemes)
            out.update({n: RotatedTensor(qt, block) for n, qt in qts.items()})
        return {n: out[n] for n in weights}
