"""One (super-)block's grid at a time, for GPTQ onto llama.cpp's block types.

llama.cpp's quantizers do two things per block: a *search* chooses the block's scales (and
minimums) from its values, then a final pass rounds every value onto the grid those scales
make. :func:`fit_block` is the search alone (the same code ``lowbit.ggml.blocks.quantize``
runs, byte for byte llama.cpp's), :func:`round_columns` the final rounding of any columns of
the block on a fitted grid, :func:`pack_block` the block bytes from a fitted grid and the
codes. ``pack_block(t, fit, round_columns(t, fit, 0, x)[0])`` is ``blocks.quantize``'s bytes
of ``x``; GPTQ instead rounds one column at a time and moves each column's error onto the
columns not yet rounded.

The final rounding is llama.cpp's for each type: the nearest grid point under the stored
(float16-rounded) scales for the K-quants (``nearest_int((x + dmin*m) / (d*sc))``, clamped to
the codes the type holds); under the *unrounded* float32 scale for Q4_0/Q5_0/Q4_1/Q5_1/Q8_0
without importance and for IQ4_NL/IQ4_XS (so a code can be one step from the nearest under
the stored scale, as in llama.cpp); and, for Q4_0/Q5_0/Q4_1/Q5_1 with importance, the inverse
scale (and offset) the search rounded its winning codes with, not the refitted scale it stores.
A group whose stored K-quant scale is zero keeps the search's codes (every code decodes to the
same value there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.ggml import blocks, iquants, kquants, legacy_blocks

__all__ = ["GPTQ_TYPES", "fit_block", "pack_block", "round_columns", "slice_rows"]

_K = {  # fit, pack, rounding kind, group size, codes (nmax or half)
    "Q2_K": (kquants._fit_q2_k, kquants._pack_q2_k, "affine", 16, 3),
    "Q3_K": (kquants._fit_q3_k, kquants._pack_q3_k, "symmetric", 16, 4),
    "Q4_K": (kquants._fit_q4_k, kquants._pack_q4_k, "affine", 32, 15),
    "Q5_K": (kquants._fit_q5_k, kquants._pack_q5_k, "affine", 32, 31),
    "Q6_K": (kquants._fit_q6_k, kquants._pack_q6_k, "symmetric", 16, 32),
    "IQ4_NL": (iquants._fit_iq4_nl, iquants._pack_iq4_nl, "table", 32, 0),
    "IQ4_XS": (iquants._fit_iq4_xs, iquants._pack_iq4_xs, "table", 32, 0),
}
_LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")

GPTQ_TYPES = (*_K, *_LEGACY)
"""The block types a grid can be fitted for (every type with scales per block of columns)."""


def _name(qtype: Any) -> str:
    t = blocks.ggml_type(qtype).name
    if t not in GPTQ_TYPES:
        raise LowbitError(
            f"{t} has no scale search to fix per block (GPTQ writes {', '.join(GPTQ_TYPES)})"
        )
    return t


def fit_block(
    qtype: Any,
    xs: np.ndarray,
    importance: np.ndarray | None = None,
    sigma2: np.ndarray | None = None,
) -> dict[str, Any]:
    """llama.cpp's scale search of one (super-)block per row.

    Args:
        qtype: a type of :data:`GPTQ_TYPES`.
        xs: float32 ``(rows, block)``: each row's values of this block.
        importance: the block's importance weights ``(block,)`` (llama.cpp's importance
            vector, these columns), or None for llama.cpp's search without one; ignored by
            types that take none (Q8_0).
        sigma2: Q4_0/Q4_1/Q5_0/Q5_1 with importance: the mean square of each row
            (:func:`lowbit.ggml.legacy_blocks.row_sigma2`), which llama.cpp weights by.

    Returns:
        The fitted grid (arrays with one row per row of ``xs``).
    """
    t = _name(qtype)
    xs = np.ascontiguousarray(xs, dtype=np.float32)
    qw = None
    if importance is not None and blocks.TYPES[t].uses_imatrix:
        qw = np.ascontiguousarray(
            np.broadcast_to(np.asarray(importance, np.float32), xs.shape), dtype=np.float32
        )
    with np.errstate(all="ignore"):
        if t in _LEGACY:
            if qw is not None and sigma2 is None:
                sigma2 = legacy_blocks.row_sigma2(xs)
            return legacy_blocks.fit_legacy(xs, t, qw, sigma2)
        return _K[t][0](xs, qw)


def round_columns(
    qtype: Any, fit: dict[str, Any], j: int, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Round columns ``j .. j + c`` of the block onto its fitted grid, as llama.cpp's final pass.

    Args:
        qtype: the block type of ``fit``.
        fit: :func:`fit_block`'s grid.
        j: the first column's index in the block.
        x: float32 ``(rows, c)``.

    Returns:
        (stored codes int ``(rows, c)``, their float32 values as ggml decodes them).
    """
    t = _name(qtype)
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        if t in _LEGACY:
            return legacy_blocks.round_legacy(fit, x)
        _, _, kind, n, k = _K[t]
        if kind == "affine":
            return kquants.round_affine(fit, n, k, j, x)
        if kind == "symmetric":
            return kquants.round_symmetric(fit, n, k, j, x)
        return iquants.round_table(fit, n, j, x)


def pack_block(qtype: Any, fit: dict[str, Any], codes: np.ndarray) -> np.ndarray:
    """The block bytes ``(rows, block bytes)`` of a fitted grid and its stored codes."""
    t = _name(qtype)
    if t in _LEGACY:
        return legacy_blocks.pack_legacy(fit, codes)
    return _K[t][1](fit, codes)


def slice_rows(fit: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    """The grid of rows ``a .. b`` only."""

    def part(v: Any) -> Any:
        if isinstance(v, np.ndarray) and v.ndim:
            return v[a:b]
        if isinstance(v, tuple):
            return tuple(part(u) for u in v)
        return v

    return {k: part(v) for k, v in fit.items()}
