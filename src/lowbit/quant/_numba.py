"""Optional compiled kernels (numba) for tensor quantization: bit for bit ``lowbit.quant._engine``'s numpy path.

Each entry point takes a chunk as ``lowbit.quant._engine`` holds it (a 4-D view and its broadcasting
scales), returns None when numba is missing, ``_fast.numpy_only()`` is on, the chunk is smaller
than ``_fast.MIN_KERNEL_SIZE`` (``_fast.use_kernels``), or the layout
does not fit, and the caller then takes the numpy path. Layouts whose last axis
(trailing axes of extent 1 dropped) is contiguous fit: in row mode the scales are one
number or constant along that axis (per-tensor, per-channel on a leading axis, groups
and blocks along the last axis, the strided views of a ragged last group); in column
mode they vary along it (per-channel on the last axis, groups along a leading one), one
row of a scale table per data row, which only the value-set and dequantize kernels take. Kernels see the rows as offsets into one contiguous
1-D view of the memory they lie in, so every inner loop runs over a contiguous slice
and vectorises.

How each keeps the numpy path's codes:

- integers (``scaled_int_codes``): round the float32 quotient half-even; a row holding
  a tie of it redoes those elements on the float64 quotient (exact for float32 operands);
- small floats (``scaled_float_codes``): the float32 quotient rounded by ``_fast``'s
  float32-lane core; a float32 quotient whose bits below the format's ``mbits + 1`` are
  zero may be a rounding boundary (a midpoint of two codes), so blocks holding one redo
  those elements from the float64 quotient, as ``_qelements._float_nearest`` does;
- value sets (``scaled_valueset_codes``): a table over a uniform grid of bins finer
  than the gaps between midpoints gives the code of every bin with no midpoint within
  ``tol`` of it; rows holding a value in another bin compare its float64 quotient with
  the midpoints, and exact ties go back to the caller for the exact codec.

llama.cpp's blocks have their compiled kernels in ``lowbit.ggml._numba``.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

import numpy as np

from lowbit._parallel import map_chunks
from lowbit.codecs import _numba as _fast
from lowbit.enums import Rounding
from lowbit.formats.reference import exact_round_quotient
from lowbit.formats.valueset import rounding_bins


@cache
def _k() -> Any:
    """``lowbit.quant._kernels``, imported (with numba) on first use."""
    from lowbit.quant import _kernels  # needs numba, the optional extra

    return _kernels


_VALUESET_BINS = 16384  # 16 KiB of table: in L1, and few rows need the exact compare


class _Rows(NamedTuple):
    """Rows of a view: ``flat[offs[r] : offs[r] + m]`` is row ``r`` (C order of the
    view's leading axes); ``flat`` is a contiguous 1-D view of the memory they lie in."""

    flat: np.ndarray
    offs: np.ndarray
    m: int


def _row_view(V: np.ndarray) -> _Rows | None:
    """The rows of ``V`` along its last axis of extent > 1, or None when that axis is
    not contiguous (or a leading stride is negative or not a whole element)."""
    while V.ndim > 1 and V.shape[-1] == 1:
        V = V[..., 0]
    if V.ndim == 0 or V.size == 0 or V.strides[-1] != V.itemsize:
        return None
    m = V.shape[-1]
    if V.flags.c_contiguous:
        return _Rows(V.reshape(-1), np.arange(0, V.size, m, dtype=np.int64), m)
    lead = V.shape[:-1]
    if any(st < 0 or st % V.itemsize for st in V.strides[:-1]):
        return None
    offs = np.zeros(lead, dtype=np.int64)
    for ax, (n, st) in enumerate(zip(lead, V.strides[:-1], strict=True)):
        shape = [1] * len(lead)
        shape[ax] = n
        offs = offs + (np.arange(n, dtype=np.int64) * (st // V.itemsize)).reshape(shape)
    offs = offs.reshape(-1)
    span = int(offs.max()) + m
    flat = np.lib.stride_tricks.as_strided(V, shape=(span,), strides=(V.itemsize,))
    return _Rows(flat, offs, m)


def _rows(
    V: np.ndarray, S: np.ndarray, dtype: Any = np.float32
) -> tuple[_Rows, np.ndarray, np.ndarray, bool] | None:
    """(the rows of V; a 2-D scale table in ``dtype``; the table row of each data row;
    whether the table holds a scale per column) or None where the rows are not
    contiguous. Row mode: scales constant along V's last non-trivial axis, one table
    column (one scale for a C-contiguous V makes it one row). Column mode: the scales
    vary along that axis (per channel on it, groups along another axis)."""
    while V.ndim > 1 and V.shape[-1] == 1:
        V = V[..., 0]
        S = S[..., 0] if S.ndim > V.ndim else S
    if V.ndim == 0 or V.size == 0 or S.ndim > V.ndim:
        return None
    s = S.astype(dtype, copy=False)
    one = np.zeros(1, dtype=np.int64)
    if s.size == 1 and V.flags.c_contiguous:
        return _Rows(V.reshape(-1), one, V.size), s.reshape(1, 1), one, False
    rows = _row_view(V)
    if rows is None:
        return None
    lead = V.shape[:-1]
    srow = np.arange(rows.offs.size, dtype=np.int64)
    if s.shape[-1] == 1:
        s2 = np.ascontiguousarray(np.broadcast_to(s, (*lead, 1))).reshape(-1, 1)
        return rows, s2, srow, False
    if s.shape[-1] != V.shape[-1]:
        return None
    s = s.reshape((1,) * (V.ndim - s.ndim) + s.shape)
    s2 = np.ascontiguousarray(s).reshape(-1, V.shape[-1])
    index = np.arange(s2.shape[0], dtype=np.int64).reshape(s.shape[:-1])
    return rows, s2, np.ascontiguousarray(np.broadcast_to(index, lead)).reshape(-1), True


def _usable_scales(s: np.ndarray) -> bool:
    """Every scale positive and finite (the kernels divide by them and index with the
    quotient); ``_engine.round_scale`` makes them so, but NaN scales may come later."""
    return bool(np.all(s > 0)) and bool(np.isfinite(s).all())


# ---- kernels, built per layout --------------------------------------------------------
#
# Every kernel takes the rows (``x``, ``offs``, ``m``), a 2-D scale table ``s2`` and the
# table row of each data row ``srow``. In row mode the table has one column, one scale
# per row; in column mode each table row holds a scale per column (per-channel on the
# last axis, groups along the first). The integer and float kernels take row mode only:
# LLVM does not vectorise a divide by a loaded vector here (measured 3-4x slower than
# numpy), so column mode goes to numpy there. The value-set and dequantize kernels, which
# gain either way, take both, with ``cols`` a compile-time constant of the kernel.


def _scale_at(s2: np.ndarray, srow: np.ndarray, cols: bool, r: Any, j: Any) -> np.ndarray:
    """The scales of flat elements (row ``r``, column ``j``) as float64."""
    return s2[srow[r], j if cols else 0].astype(np.float64)


def scaled_int_codes(
    V: np.ndarray, S: np.ndarray, away: bool, lo: float, hi: float, bits: int
) -> np.ndarray | None:
    """uint8 codes of clip(round(V / S), lo, hi) of the exact quotient for float32 or
    float64 ``V`` (ties to even, or away from zero), or None (the caller's numpy path)."""
    if not _fast.use_kernels(V.size) or V.dtype not in (np.float32, np.float64) or bits > 8:
        return None
    found = _rows(V, S)
    if found is None:
        return None
    (x, offs, m), s2, srow, cols = found
    if cols:  # a scale per column: LLVM does not vectorise that divide; numpy's is faster
        return None
    out = np.empty(offs.size * m, dtype=np.uint8)
    mask = (1 << bits) - 1
    if V.dtype == np.float32:
        _k()._int_kernel()(x, offs, m, s2, srow, out, bool(away), float(lo), float(hi), mask)
        return out.reshape(V.shape)
    ties = np.empty(4096, dtype=np.int64)
    nt = _k()._int64_kernel()(x, offs, m, s2, srow, out, float(lo), float(hi), mask, ties)
    if nt < 0:
        return None
    if nt:  # the float64 quotient says half way: decide on the exact one
        at = ties[:nt]
        r, j = at // m, at % m
        mode = Rounding.NEAREST_AWAY if away else Rounding.NEAREST_EVEN
        q = exact_round_quotient(x[offs[r] + j], _scale_at(s2, srow, False, r, j), mode)
        out[at] = (np.clip(q, lo, hi).astype(np.int64) & mask).astype(np.uint8)
    return out.reshape(V.shape)


# ---- small floats ------------------------------------------------------------------------


def scaled_float_codes(V: np.ndarray, S: np.ndarray, fmt: Any, mode: int) -> np.ndarray | None:
    """uint8 codes of ``fmt.encode(V / S, saturate=True)`` (the float64 quotient, nearest
    rounding: ``mode`` 0 ties to even, 1 away) for float32 or float64 ``V`` and a float
    format of at most 8 bits, or None (the caller's numpy path)."""
    if not _fast.use_kernels(V.size) or V.dtype not in (np.float32, np.float64) or fmt.bits > 8:
        return None
    T = _fast._tail_params(fmt, True)
    P = _fast._round32_params(fmt, mode) if V.dtype == np.float32 else None
    if mode not in (0, 1) or T is None or np.dtype(fmt.code_dtype) != np.uint8:
        return None
    if P is None and V.dtype == np.float32:
        return None
    found = _rows(V, S)
    if found is None or not _usable_scales(found[1]):
        return None
    (x, offs, m), s2, srow, cols = found
    if cols:  # a scale per column: LLVM does not vectorise that divide; numpy's is faster
        return None
    out = np.empty(offs.size * m, dtype=np.uint8)
    P64 = _fast._round64_params(fmt, mode)
    if V.dtype == np.float64:
        _k()._float64_kernel(mode)(x, offs, m, s2, srow, out, T, P64)
    else:
        low = (1 << (23 - (fmt.mbits + 1))) - 1
        _k()._float_kernel(mode, _fast._kind(fmt))(x, offs, m, s2, srow, out, P, T, P64, low)
    return out.reshape(V.shape)


# ---- value sets (NF4 and the like) -------------------------------------------------------------


@cache
def _valueset_table(fmt: Any) -> tuple[np.ndarray, np.ndarray, np.float32, float]:
    """(bin table, float64 midpoints, the grid's origin in bins, bins per unit).

    ``table[b]`` is the code of bin ``b`` (the count of midpoints below its lower edge),
    plus 128 when a midpoint lies in the bin or within ``tol`` of it: the numpy path's
    tables (``lowbit.formats.valueset.rounding_bins``), finer. ``tol`` (2**-20 of the largest
    magnitude) is several times the error of the float32 bin index."""
    base, risky, mids, _tol, lo, inv_w = rounding_bins(fmt, _VALUESET_BINS)
    table = (base | (risky.astype(np.uint8) << 7)).astype(np.uint8)
    return table, mids, np.float32(lo * inv_w), inv_w


def scaled_valueset_codes(V: np.ndarray, S: np.ndarray, fmt: Any, mode: Any) -> np.ndarray | None:
    """uint8 codes of ``fmt.encode(V / S, saturate=True)`` (the float64 quotient, nearest
    rounding ``mode``) for float32 or float64 ``V`` and a value set of at most 7 bits, or
    None. Bin indices are computed in float32 either way (their error stays far below
    ``tol``); the exact compare divides in float64, the quotient the codec is given."""
    if not _fast.use_kernels(V.size) or V.dtype not in (np.float32, np.float64) or fmt.bits > 7:
        return None
    found = _rows(V, S)
    if found is None or not _usable_scales(found[1]):
        return None
    (x, offs, m), s2, srow, cols = found
    table, mids, lo_w, inv_w = _valueset_table(fmt)
    k64 = inv_w / s2.astype(np.float64)
    if np.any(k64 > np.finfo(np.float32).max):
        return None  # a tiny scale: the bin index would overflow float32
    k2 = k64.astype(np.float32)
    out = np.empty(offs.size * m, dtype=np.uint8)
    flagged = np.empty((offs.size * -(-m // _k()._BLOCK), 2), dtype=np.int64)
    nf = _k()._valueset_kernel(cols)(x, offs, m, k2, srow, out, table, lo_w, flagged)
    ties = np.empty(1024, dtype=np.int64)
    cstep = int(cols)
    nt = _k()._valueset_redo(
        x, offs, m, s2, k2, srow, cstep, out, table, mids, lo_w, flagged, nf, ties
    )
    if nt < 0:
        return None
    if nt:  # exact midpoints: the codec's tie rule
        at = ties[:nt]
        r, j = at // m, at % m
        t = x[offs[r] + j].astype(np.float64) / _scale_at(s2, srow, cols, r, j)
        out[at] = fmt.encode(t, rounding=mode.value, saturate=True, nan="zero")
    return out.reshape(V.shape)


# ---- dequantizing ----------------------------------------------------------------------------


def dequantize8(
    codes: np.ndarray, table: np.ndarray, S: np.ndarray, Z: np.ndarray | None, dst: np.ndarray
) -> bool:
    """``dst[...] = (table[codes] - Z) * S`` for flat 8-bit ``codes`` (``dst``'s elements
    in C order) into ``dst`` (the table's dtype, rows contiguous; ``S`` and ``Z``
    broadcast alike); False where the kernel does not apply (nothing written)."""
    if not _fast.use_kernels(codes.size) or codes.dtype != np.uint8 or dst.dtype != table.dtype:
        return False
    found = _rows(dst, S, dst.dtype)
    if found is None or codes.size != dst.size:
        return False
    (y, offs, m), s2, srow, cols = found
    z2 = s2
    if Z is not None:
        if Z.shape != S.shape:
            return False
        z2 = _rows(dst, Z, dst.dtype)[1]  # type: ignore[index]
    _k()._dequant_kernel(cols)(codes.reshape(-1), table, s2, z2, Z is not None, y, offs, m, srow)
    return True


# ---- per-group min and max (``scales.minmax``) ---------------------------------------------


def row_minmax(V: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``scales.minmax`` over the last axis (at most 128 long) of a C-contiguous float32
    array by a compiled loop (float64 results shaped like numpy's), or None when numba is
    missing, rows are longer, or the answer could differ from numpy's (a NaN, a zero
    extreme: the caller's numpy path)."""
    if (
        not _fast.use_kernels(V.size)
        or V.dtype != np.float32
        or V.ndim < 1
        or not V.flags.c_contiguous
    ):
        return None
    if V.size == 0 or not 2 <= V.shape[-1] <= 128:  # numpy's reduceat wins on long rows
        return None
    V2 = V.reshape(-1, V.shape[-1])
    mn = np.empty(V2.shape[0], dtype=np.float32)
    mx = np.empty(V2.shape[0], dtype=np.float32)
    if not _k()._row_minmax_kernel(V2, mn, mx):
        return None
    shape = (*V.shape[:-1], 1)
    return mn.reshape(shape).astype(np.float64), mx.reshape(shape).astype(np.float64)


_SEGMENT = 1 << 20  # elements per thread's share of one long row


def row_absmax(V: np.ndarray) -> np.ndarray | None:
    """max |V| over the last axis (of extent > 1) of a float32 or float64 array whose rows
    are contiguous, as float64 shaped like ``scales.minmax``'s results (NaN where a row
    holds a NaN), or None (the caller's numpy path)."""
    if not _fast.use_kernels(V.size) or V.dtype not in (np.float32, np.float64):
        return None
    if V.ndim < 1 or V.shape[-1] <= 1:
        return None
    rows = _row_view(V)
    if rows is None:
        return None
    x, offs, m = rows
    udt = np.dtype(np.uint32 if V.dtype == np.float32 else np.uint64)
    u = x.view(udt)
    mask = udt.type((1 << (8 * udt.itemsize - 1)) - 1)
    bits = np.empty(offs.size, dtype=udt)
    if offs.size == 1 and m >= 4 * _SEGMENT:  # one long row (per-tensor): segments on threads

        def seg(a: int) -> Any:
            part = np.empty(1, dtype=udt)
            _k()._row_absmax_kernel(u, np.array([offs[0] + a]), min(_SEGMENT, m - a), mask, part)
            return part[0]

        bits[0] = max(map_chunks(seg, list(range(0, m, _SEGMENT))))
    else:
        _k()._row_absmax_kernel(u, offs, m, mask, bits)
    return bits.view(V.dtype).astype(np.float64).reshape(*V.shape[:-1], 1)


_NVFP4_ROWS_VALUES = 1 << 20  # values per thread's band of rows


def nvfp4_encode(
    arr: np.ndarray, g: np.float32
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """NVFP4 (E2M1 in groups of 16 along the last axis, E4M3 group scales under the float32
    tensor scale ``g``, compressed-tensors' served rounding) of a finite, C-contiguous float32
    array whose last axis is a multiple of 16, in one compiled pass: (packed codes as the
    engine's ``_pack_unchecked`` packs them, E4M3 group scales, what the codes multiply), the
    scales shaped ``(*arr.shape[:-1], groups)``; or None (the engine's chunked numpy path, the
    same bits)."""
    if not _fast.use_kernels(arr.size) or arr.dtype != np.float32 or arr.ndim < 1:
        return None
    cols = int(arr.shape[-1])
    if cols % 16 or not arr.flags.c_contiguous:
        return None
    x = arr.reshape(-1, cols)
    packed = np.empty((x.shape[0], cols // 2), dtype=np.uint8)
    s = np.empty((x.shape[0], cols // 16), dtype=np.float32)
    e = np.empty_like(s)
    step = max(1, _NVFP4_ROWS_VALUES // cols)
    kernel = _k()._nvfp4_kernel

    def band(a: int) -> None:
        b = a + step
        kernel(x[a:b], np.float32(g), packed[a:b], s[a:b], e[a:b])

    map_chunks(band, range(0, x.shape[0], step))
    shape = (*arr.shape[:-1], cols // 16)
    return packed.reshape(-1), s.reshape(shape), e.reshape(shape)
