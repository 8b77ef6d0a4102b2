"""Tile granularity: one scale per 2-D block of a weight (FP8 blocks, 128x128 by default).

A tensor is seen as ``R x C`` (rows = every axis but the last; a 1-D tensor is one row),
padded with zeros to whole tiles as compressed-tensors' ``maybe_pad_tensor_for_block_quant``
pads it (zeros change no block's largest magnitude), scaled per tile and cropped back. Under
absmax with float32 scales the scale is ``float32(amax) / element_max`` divided in float32
and an all-zero tile's scale is float32's epsilon, as compressed-tensors' ``calculate_qparams``
makes them; codes round the float32 quotient (``lowbit.quant._elements.served_codes``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from lowbit.codecs.packing import _pack_unchecked, unpack
from lowbit.errors import LowbitError
from lowbit.quant._choose import choose_scale, round_scale, value_table
from lowbit.quant._elements import served_codes
from lowbit.quant.scheme import ScaleMethod, tile_grid

if TYPE_CHECKING:
    from lowbit.quant.scheme import Scheme

_AXES = (1, 3)


def _grid(shape: tuple[int, ...], scheme: Scheme) -> tuple[int, int, int, int, int, int]:
    bh, bw = scheme.block_shape  # type: ignore[misc]
    nr, nc = tile_grid(shape, (bh, bw))
    cols = shape[-1]
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    return rows, cols, nr, nc, bh, bw


def _tiled(x2: np.ndarray, nr: int, nc: int, bh: int, bw: int) -> np.ndarray:
    rows, cols = x2.shape
    if (rows, cols) != (nr * bh, nc * bw):
        padded = np.zeros((nr * bh, nc * bw), dtype=x2.dtype)
        padded[:rows, :cols] = x2
        x2 = padded
    return x2.reshape(nr, bh, nc, bw)


def encode_tiles(arr: np.ndarray, scheme: Scheme, nan: str) -> tuple[np.ndarray, np.ndarray]:
    """(packed codes, per-tile float32 scales) of ``arr`` (see the module docstring).

    Raises:
        LowbitError: NaN/inf under ``nan="raise"``, a scale past its format's range.
    """
    fmt = scheme.element_format
    rows, cols, nr, nc, bh, bw = _grid(arr.shape, scheme)
    x2 = arr.reshape(rows, cols)
    mask = ~np.isfinite(x2)
    has_bad = bool(mask.any())
    if has_bad:
        if nan == "raise":
            n_nan = int(np.isnan(x2).sum())
            raise LowbitError(
                f"input contains {n_nan} NaN and {int(mask.sum()) - n_nan} infinite values; "
                "pass nan='propagate' to keep them (NaN codes or NaN tile scales)"
            )
        x2 = np.where(mask, x2.dtype.type(0), x2)
    V = _tiled(x2, nr, nc, bh, bw)
    mx = np.max(V, axis=_AXES, keepdims=True).astype(np.float64)
    mn = np.min(V, axis=_AXES, keepdims=True).astype(np.float64)
    if scheme.scale_method is ScaleMethod.ABSMAX:
        amax = np.maximum(mx, -mn).astype(np.float32)
        s32 = (amax / np.float32(fmt.max)).astype(np.float32)
        if scheme.scale_format == "float32":
            s32 = np.where(s32 == 0, np.finfo(np.float32).eps, s32).astype(np.float32)
        else:
            s32 = round_scale(np.where(s32 > 0, s32, 1.0).astype(np.float64), scheme.scale_format)
    else:
        s32, _, _ = choose_scale(V, _AXES, mn, mx, scheme, fmt)
    codes = served_codes(V, s32, fmt)
    codes = codes.reshape(nr * bh, nc * bw)[:rows, :cols]
    scale = s32.reshape(nr, nc)
    if has_bad:
        codes = np.array(codes)
        if fmt.kind == "float" and fmt.nan_code is not None:  # type: ignore[attr-defined]
            codes[mask] = fmt.nan_code  # type: ignore[attr-defined]
        else:
            bad = _tiled(mask, nr, nc, bh, bw).any(axis=_AXES)
            scale = np.where(bad, np.float32(np.nan), scale).astype(np.float32)
    if arr.ndim == 1:
        scale = scale.reshape(nc)
    packed = _pack_unchecked(np.ascontiguousarray(codes).reshape(-1), fmt.bits)
    return packed, scale


def decode_tiles(
    packed: np.ndarray, scale: np.ndarray, shape: tuple[int, ...], scheme: Scheme, work: Any
) -> np.ndarray:
    """``value(code) * tile scale`` in ``work`` for codes quantized with tile granularity."""
    fmt = scheme.element_format
    rows, cols, nr, nc, bh, bw = _grid(shape, scheme)
    table = value_table(fmt, work)
    v = np.take(table, unpack(packed, fmt.bits, rows * cols)).reshape(rows, cols)
    s = np.asarray(scale, dtype=work).reshape(nr, nc)
    full = np.repeat(np.repeat(s, bh, axis=0)[:rows], bw, axis=1)[:, :cols]
    return (v * full).astype(work, copy=False).reshape(shape)
