"""Block Hadamard rotations sized to the scale block (MR-GPTQ's, arXiv 2509.23202).

A linear layer ``y = x Wᵀ`` computes the same with its input rotated and its weight rotated
alike: for an orthogonal ``R``, ``(x R)(W R)ᵀ = x Wᵀ``. With ``R`` block-diagonal, each block the
normalised Sylvester Hadamard matrix ``H_b`` of the scale group's size ``b`` (16 for NVFP4, 32
for MXFP4), the rotation mixes values only inside a scale group: it spreads an outlier over its
group, so the group's scale no longer follows one value, and it costs ``O(b)`` per value online.
``H_b`` is symmetric and its own inverse (``H_b H_b = I``).

Where the rotation cancels offline (a consumer that already sees ``x R``) it is folded into the
weights; elsewhere the consumer applies ``x ↦ x R`` to the layer's input before quantizing it,
as vLLM's MR-GPTQ kernels do. ``lowbit eval --methods hadamard`` measures the second way: every
quantized linear weight is rotated before rounding, and its input is rotated in the forward pass.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from lowbit.errors import LowbitError

__all__ = ["hadamard", "rotate_blocks", "rotate_rows", "rotation_block"]


@cache
def hadamard(n: int) -> np.ndarray:
    """The normalised Sylvester Hadamard matrix of order ``n`` (a power of two), float64:
    symmetric, orthogonal, entries ``±1/sqrt(n)``.

    Raises:
        LowbitError: ``n`` not a power of two.
    """
    if n < 1 or n & (n - 1):
        raise LowbitError(f"a Sylvester Hadamard matrix has a power-of-two order, not {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    out = h / np.sqrt(n)
    out.setflags(write=False)
    return out


def rotation_block(scheme: Any) -> int:
    """The block a scheme's rotation uses: its group (or MX block) size.

    Raises:
        LowbitError: a scheme without groups along the input axis, or a group that is not a
            power of two.
    """
    g = getattr(scheme, "group_size", None)
    gran = str(getattr(getattr(scheme, "granularity", None), "value", ""))
    axis = getattr(scheme, "axis", None)
    if gran not in ("group", "block") or g is None or axis is None or axis % 2 != 1:
        raise LowbitError(
            f"a block Hadamard rotation is sized to the scale group along the input axis; "
            f"{getattr(scheme, 'label', scheme)} has none (use nvfp4, mxfp4 or int4:g32 ...)"
        )
    if g & (g - 1):
        raise LowbitError(f"the rotation block is the group, {g}: it must be a power of two")
    return int(g)


def rotate_rows(w: Any, block: int) -> Any:
    """``w`` with each row's consecutive ``block`` values multiplied by ``H_block``: ``W R`` for a
    weight ``[out, in]``, ``x R`` for inputs ``[..., in]`` (numpy or torch, float).

    Raises:
        LowbitError: the last dimension not a multiple of ``block``.
    """
    if w.shape[-1] % block:
        raise LowbitError(
            f"rows of {w.shape[-1]} values do not split into Hadamard blocks of {block}: keep "
            "this layer unrotated or choose a group that divides it"
        )
    return rotate_blocks(w, hadamard(block))


def rotate_blocks(x: Any, m: Any) -> Any:
    """``x`` with each consecutive block of ``m.shape[0]`` values of its last axis multiplied
    by the square matrix ``m`` (``x_block @ m``), in ``x``'s dtype: numpy in float64, torch in
    float32 (``m`` numpy or an already-made torch tensor, which a hook reuses call after call).
    The caller checks that the block divides the last axis."""
    b = m.shape[0]
    if isinstance(x, np.ndarray):
        v = x.astype(np.float64).reshape(*x.shape[:-1], x.shape[-1] // b, b)
        return (v @ np.asarray(m, dtype=np.float64)).reshape(x.shape).astype(x.dtype)
    import torch

    mt = m if isinstance(m, torch.Tensor) else torch.tensor(np.array(m), dtype=torch.float32)
    v = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // b, b)
    return (v @ mt.to(device=x.device)).reshape(x.shape).to(x.dtype)
