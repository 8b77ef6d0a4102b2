"""Optional compiled kernels (numba) for tensor quantization: bit for bit ``_qengine``'s numpy path.

Each entry point takes a chunk as ``_qengine`` holds it (a C-contiguous 4-D view and its
broadcasting scales), returns None when numba is missing, ``_fast.numpy_only()`` is on,
or the layout does not fit, and the caller then takes the numpy path. The layouts that
fit are "one scale per row": the data's trailing axes of extent 1 dropped, the scales
either one number or constant along the last axis (per-tensor, per-channel on a leading
axis, groups and blocks along the last axis).

How each keeps the numpy path's codes:

- integers (``scaled_int_codes``): round the float32 quotient half-even; a row holding
  a tie of it redoes those elements on the float64 quotient (exact for float32 operands);
- small floats (``scaled_float_codes``): the float32 quotient rounded by ``_fast``'s
  float32-lane core; a float32 quotient whose bits below the format's ``mbits + 1`` are
  zero may be a rounding boundary (a midpoint of two codes), so blocks holding one redo
  those elements from the float64 quotient, as ``_qengine._float_nearest`` does;
- value sets (``scaled_valueset_codes``): a table over a uniform grid of bins finer
  than the gaps between midpoints gives the code of every bin with no midpoint within
  ``tol`` of it; rows holding a value in another bin compare its float64 quotient with
  the midpoints, and exact ties go back to the caller for the exact codec.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from lowbit import _fast

HAVE_NUMBA = _fast.HAVE_NUMBA
_BLOCK = 256  # elements per edge-check block of long rows (a redo rescans one block)
_VALUESET_BINS = 16384  # 16 KiB of table: in L1, and few rows need the exact compare

if HAVE_NUMBA:
    from numba import njit

    from lowbit._fast import (
        _GENERIC,
        _bits32,
        _bits64,
        _finish,
        _round32,
        _round64,
    )


def _rows(
    V: np.ndarray, S: np.ndarray, dtype: Any = np.float32
) -> tuple[np.ndarray, np.ndarray] | None:
    """(V as rows (n, m), one scale per row in ``dtype``; one number for all rows when
    ``S`` is one) or None where the scales are not constant along V's last non-trivial
    axis or V is not C-contiguous."""
    while V.ndim > 1 and V.shape[-1] == 1:
        V = V[..., 0]
        S = S[..., 0] if S.ndim > V.ndim else S
    if V.ndim == 0 or V.size == 0 or not V.flags.c_contiguous or S.ndim > V.ndim:
        return None
    s = S.astype(dtype, copy=False)
    if s.size == 1:
        return V.reshape(1, -1), s.reshape(1)
    if s.shape[-1] != 1:
        return None
    s = np.ascontiguousarray(np.broadcast_to(s, (*V.shape[:-1], 1))).reshape(-1)
    return V.reshape(-1, V.shape[-1]), s


def _usable_scales(s: np.ndarray) -> bool:
    """Every scale positive and finite (the kernels divide by them and index with the
    quotient); ``_qengine.round_scale`` makes them so, but NaN scales may come later."""
    return bool(np.all(s > 0)) and bool(np.isfinite(s).all())


# ---- integers ------------------------------------------------------------------------

if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _scaled_int_kernel(V, s, out, away, lo, hi, mask):  # type: ignore[no-untyped-def]
        """``out[i, j]`` = the code of clip(round(V[i, j] / s[i]), lo, hi): the float32
        quotient rounded half-even, its ties re-done on the float64 quotient (exact for
        float32 operands) with ``away`` choosing ties away from zero, as the numpy path."""
        n, m = V.shape
        for i in range(n):
            si = s[i]
            tie = False
            for j in range(m):  # branch-free, so it vectorises
                t = np.float32(V[i, j] / si)
                r = np.float64(np.rint(t))
                tie |= abs(np.float64(t) - r) == 0.5
                r = min(max(r, lo), hi)
                out[i, j] = np.uint8(np.int64(r) & mask)
            if not tie:
                continue
            s64 = np.float64(si)
            for j in range(m):  # a row with a tie of the float32 quotient: redo those
                x = V[i, j]
                t = np.float32(x / si)
                if abs(np.float64(t) - np.float64(np.rint(t))) != 0.5:
                    continue
                t64 = np.float64(x) / s64
                r = np.rint(t64)
                if away:
                    fl = np.floor(t64)
                    if t64 - fl == 0.5:
                        r = fl + 1.0 if t64 > 0 else fl
                r = min(max(r, lo), hi)
                out[i, j] = np.uint8(np.int64(r) & mask)


def scaled_int_codes(
    V: np.ndarray, S: np.ndarray, away: bool, lo: float, hi: float, bits: int
) -> np.ndarray | None:
    """uint8 codes of clip(round(V / S), lo, hi) for float32 ``V`` (ties to even, or away
    from zero), or None (the caller's numpy path)."""
    if not _fast.enabled() or V.dtype != np.float32 or bits > 8:
        return None
    rows = _rows(V, S)
    if rows is None:
        return None
    V2, s = rows
    out = np.empty(V2.shape, dtype=np.uint8)
    _scaled_int_kernel(V2, s, out, bool(away), float(lo), float(hi), (1 << bits) - 1)
    return out.reshape(V.shape)


# ---- small floats ------------------------------------------------------------------------

_FLOAT_KERNELS: dict[tuple[int, int], Any] = {}


def _float_kernel(mode: int, kind: int) -> Any:
    """The scaled-float kernel for a rounding mode (0 even, 1 away) and a format kind,
    both compile-time constants so the first pass vectorises (built on first use)."""
    k = _FLOAT_KERNELS.get((mode, kind))
    if k is not None:
        return k

    @njit(cache=True, nogil=True)
    def kernel(V, s, out, P, T, P64, lowmask):  # type: ignore[no-untyped-def]
        n, m = V.shape
        maxc = T[0]
        low = np.uint32(lowmask)
        zero = np.uint32(0)
        for i in range(n):
            si = s[i]
            s64 = np.float64(si)
            for j0 in range(0, m, _BLOCK):
                # 1-D slices: indexing the 2-D arrays with an offset stops vectorising
                v = V[i, j0 : j0 + _BLOCK]
                o = out[i, j0 : j0 + _BLOCK]
                edge = False
                for j in range(v.size):
                    t = np.float32(v[j] / si)
                    mag, neg, a, isnan, isinf = _round32(t, P, mode, kind)
                    o[j] = np.uint8(_finish(mag, neg, a != zero, isnan, isinf, T, mode, kind))
                    edge |= (_bits32(t) & low) == zero
                if not edge:
                    continue
                for j in range(v.size):  # maybe a boundary: round the float64 quotient
                    t = np.float32(v[j] / si)
                    if (_bits32(t) & low) != zero:
                        continue
                    u = _bits64(np.float64(v[j]) / s64)
                    mag, neg, a, isnan, isinf = _round64(u, np.uint64(0), P64, mode, maxc)
                    c = _finish(mag, neg, a != np.uint64(0), isnan, isinf, T, mode, _GENERIC)
                    o[j] = np.uint8(c)

    _FLOAT_KERNELS[(mode, kind)] = kernel
    return kernel


def scaled_float_codes(V: np.ndarray, S: np.ndarray, fmt: Any, mode: int) -> np.ndarray | None:
    """uint8 codes of ``fmt.encode(V / S, saturate=True)`` (the float64 quotient, nearest
    rounding: ``mode`` 0 ties to even, 1 away) for float32 ``V`` and a float format of at
    most 8 bits, or None (the caller's numpy path)."""
    if not _fast.enabled() or V.dtype != np.float32 or fmt.bits > 8 or mode not in (0, 1):
        return None
    P = _fast._round32_params(fmt, mode)
    T = _fast._tail_params(fmt, True)
    if P is None or T is None or np.dtype(fmt.code_dtype) != np.uint8:
        return None
    rows = _rows(V, S)
    if rows is None or not _usable_scales(rows[1]):
        return None
    V2, s = rows
    out = np.empty(V2.shape, dtype=np.uint8)
    shift = 23 - (fmt.mbits + 1)
    kernel = _float_kernel(mode, _fast._kind(fmt))
    kernel(V2, s, out, P, T, _fast._round64_params(fmt, mode), (1 << shift) - 1)
    return out.reshape(V.shape)


# ---- value sets (NF4 and the like) -------------------------------------------------------------


@cache
def _valueset_table(fmt: Any) -> tuple[np.ndarray, np.ndarray, np.float32, float]:
    """(bin table, float64 midpoints, the grid's origin in bins, bins per unit).

    ``table[b]`` is the code of bin ``b`` (the count of midpoints below its lower edge),
    plus 128 when a midpoint lies in the bin or within ``tol`` of it. ``tol`` (2**-20 of
    the largest magnitude) is several times the error of the float32 bin index."""
    t = fmt.values().astype(np.float64)
    mids = (t[:-1] + t[1:]) / 2
    lo, hi = float(t[0]), float(t[-1])
    tol = max(abs(lo), abs(hi)) * 2.0**-20
    nbins = _VALUESET_BINS
    edges = lo + (hi - lo) * np.arange(nbins + 1) / nbins
    base = np.searchsorted(mids, edges[:-1], side="left")
    risky = np.searchsorted(mids, edges[1:] + tol, side="left") > np.searchsorted(
        mids, edges[:-1] - tol, side="left"
    )
    base[-1] = mids.size  # the top bin holds the top value (and all that clips there)
    table = (base | (risky.astype(np.int64) << 7)).astype(np.uint8)
    inv_w = nbins / (hi - lo)
    return table, mids, np.float32(lo * inv_w), inv_w


if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _valueset_pass(V, s, out, table, lo_w, inv_w, flagged):  # type: ignore[no-untyped-def]
        """Codes from the bin table; the (row, block) pairs holding a risky bin go to
        ``flagged``; return how many."""
        n, m = V.shape
        top = np.float32(table.size - 1)
        nb = min(m, _BLOCK)
        bins = np.empty(nb, dtype=np.int32)
        nf = 0
        for i in range(n):
            k = np.float32(inv_w / np.float64(s[i]))
            for j0 in range(0, m, nb):
                v = V[i, j0 : j0 + nb]
                o = out[i, j0 : j0 + nb]
                L = v.size
                for j in range(L):  # vectorises: the bin index of each quotient
                    b = np.float32(v[j] * k) - lo_w
                    bins[j] = np.int32(min(max(b, np.float32(0)), top))
                r = np.uint8(0)
                for j in range(L):
                    c = table[bins[j]]
                    o[j] = c & np.uint8(127)
                    r |= c
                if r >= np.uint8(128):
                    flagged[nf, 0] = i
                    flagged[nf, 1] = j0
                    nf += 1
        return nf

    @njit(cache=True, nogil=True)
    def _valueset_redo(V, s, out, table, mids, lo_w, inv_w, flagged, nf, ties):  # type: ignore[no-untyped-def]
        """The flagged blocks' risky elements: count the midpoints below the float64
        quotient; exact ties go to ``ties`` (flat indices). Return how many, or -1 when
        ``ties`` is full."""
        _, m = V.shape
        top = np.float32(table.size - 1)
        nb = min(m, _BLOCK)
        nt = 0
        for f in range(nf):
            i = flagged[f, 0]
            j0 = flagged[f, 1]
            k = np.float32(inv_w / np.float64(s[i]))
            s64 = np.float64(s[i])
            for j in range(j0, min(j0 + nb, m)):
                b = np.float32(V[i, j] * k) - lo_w
                if table[np.int32(min(max(b, np.float32(0)), top))] < np.uint8(128):
                    continue
                t = np.float64(V[i, j]) / s64
                c = 0
                for q in range(mids.size):
                    c += t > mids[q]
                    if t == mids[q]:
                        if nt == ties.size:
                            return -1
                        ties[nt] = i * m + j
                        nt += 1
                out[i, j] = c
        return nt


def scaled_valueset_codes(V: np.ndarray, S: np.ndarray, fmt: Any, mode: Any) -> np.ndarray | None:
    """uint8 codes of ``fmt.encode(V / S, saturate=True)`` (the float64 quotient, nearest
    rounding ``mode``) for float32 ``V`` and a value set of at most 7 bits, or None."""
    if not _fast.enabled() or V.dtype != np.float32 or fmt.bits > 7:
        return None
    rows = _rows(V, S)
    if rows is None or not _usable_scales(rows[1]):
        return None
    V2, s = rows
    table, mids, lo_w, inv_w = _valueset_table(fmt)
    if np.any(inv_w / s.astype(np.float64) > np.finfo(np.float32).max):
        return None  # a tiny scale: the bin index would overflow float32
    out = np.empty(V2.shape, dtype=np.uint8)
    n, m = V2.shape
    flagged = np.empty((n * -(-m // _BLOCK), 2), dtype=np.int64)
    nf = _valueset_pass(V2, s, out, table, lo_w, inv_w, flagged)
    ties = np.empty(1024, dtype=np.int64)
    nt = _valueset_redo(V2, s, out, table, mids, lo_w, inv_w, flagged, nf, ties)
    if nt < 0:
        return None
    if nt:  # exact midpoints: the codec's tie rule
        at = ties[:nt]
        t = V2.reshape(-1)[at].astype(np.float64) / s[at // m].astype(np.float64)
        out.reshape(-1)[at] = fmt.encode(t, rounding=mode.value, saturate=True, nan="zero")
    return out.reshape(V.shape)


# ---- packing and dequantizing ----------------------------------------------------------------

if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _pack4_kernel(c, out):  # type: ignore[no-untyped-def]
        for i in range(c.size // 2):
            out[i] = np.uint8(c[2 * i] | (c[2 * i + 1] << np.uint8(4)))

    @njit(cache=True, nogil=True)
    def _dequant_kernel(codes, table, s, z, has_z, out):  # type: ignore[no-untyped-def]
        """``out[i, j] = (table[codes[i, j]] - z[i]) * s[i]`` in the table's dtype."""
        n, m = codes.shape
        for i in range(n):
            si = s[i]
            if has_z:
                zi = z[i]
                for j in range(m):
                    out[i, j] = (table[codes[i, j]] - zi) * si
            else:
                for j in range(m):
                    out[i, j] = table[codes[i, j]] * si


def pack4(flat: np.ndarray) -> np.ndarray | None:
    """Two uint8 4-bit codes per byte, element 0 in the low nibble (``packing``'s order),
    for an even count; None where the kernel does not apply."""
    if not _fast.enabled() or flat.dtype != np.uint8 or flat.size % 2 or flat.ndim != 1:
        return None
    out = np.empty(flat.size // 2, dtype=np.uint8)
    _pack4_kernel(np.ascontiguousarray(flat), out)
    return out


def dequantize8(
    codes: np.ndarray, table: np.ndarray, S: np.ndarray, Z: np.ndarray | None, dst: np.ndarray
) -> bool:
    """``dst[...] = (table[codes] - Z) * S`` for flat 8-bit ``codes`` filling C-contiguous
    ``dst`` (the table's dtype; ``S`` and ``Z`` broadcast alike); False where the kernel
    does not apply (nothing written)."""
    if not _fast.enabled() or codes.dtype != np.uint8 or dst.dtype != table.dtype:
        return False
    rows = _rows(dst, S, dst.dtype)
    if rows is None or codes.size != dst.size:
        return False
    D2, s = rows
    z = s[:0]
    if Z is not None:
        if Z.shape != S.shape:
            return False
        z = _rows(dst, Z, dst.dtype)[1]  # type: ignore[index]
    _dequant_kernel(codes.reshape(D2.shape), table, s, z, Z is not None, D2)
    return True


# ---- per-group min and max (``scales.minmax``) ---------------------------------------------

if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _row_minmax_kernel(V, mn, mx):  # type: ignore[no-untyped-def]
        """Min and max of each row of ``V`` in one pass; return False (results unusable)
        when a row holds a NaN or has a zero extreme (whose sign numpy may pick either way)."""
        n, m = V.shape
        for i in range(n):
            lo = V[i, 0]
            hi = V[i, 0]
            nan = False
            for j in range(m):
                x = V[i, j]
                nan |= x != x
                lo = min(lo, x)
                hi = max(hi, x)
            if nan or lo == 0 or hi == 0:
                return False
            mn[i] = lo
            mx[i] = hi
        return True


def row_minmax(V: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``scales.minmax`` over the last axis (at most 128 long) of a C-contiguous float32
    array by a compiled loop (float64 results shaped like numpy's), or None when numba is
    missing, rows are longer, or the answer could differ from numpy's (a NaN, a zero
    extreme: the caller's numpy path)."""
    if not _fast.enabled() or V.dtype != np.float32 or V.ndim < 1 or not V.flags.c_contiguous:
        return None
    if V.size == 0 or not 2 <= V.shape[-1] <= 128:  # numpy's reduceat wins on long rows
        return None
    V2 = V.reshape(-1, V.shape[-1])
    mn = np.empty(V2.shape[0], dtype=np.float32)
    mx = np.empty(V2.shape[0], dtype=np.float32)
    if not _row_minmax_kernel(V2, mn, mx):
        return None
    shape = (*V.shape[:-1], 1)
    return mn.reshape(shape).astype(np.float64), mx.reshape(shape).astype(np.float64)


if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _row_absmax_kernel(V, out):  # type: ignore[no-untyped-def]
        """Largest magnitude bit pattern of each row (integer max: it vectorises, and a
        NaN, whose pattern is above infinity's, comes out as a NaN)."""
        n, m = V.shape
        for i in range(n):
            v = V[i]
            acc = np.uint32(0)
            for j in range(m):
                acc = max(acc, _bits32(v[j]) & np.uint32(0x7FFFFFFF))
            out[i] = acc


_SEGMENT = 1 << 20  # elements per thread's share of one long row


def row_absmax(V: np.ndarray) -> np.ndarray | None:
    """max |V| over the last axis of a C-contiguous float32 array (float64, shaped like
    ``scales.minmax``'s results; NaN where a row holds a NaN), or None (numpy path)."""
    if not _fast.enabled() or V.dtype != np.float32 or V.ndim < 1 or not V.flags.c_contiguous:
        return None
    if V.size == 0 or V.shape[-1] == 0:
        return None
    V2 = V.reshape(-1, V.shape[-1])
    n, m = V2.shape
    bits = np.empty(n, dtype=np.uint32)
    if n == 1 and m >= 4 * _SEGMENT:  # one long row (per-tensor): segments on threads
        from lowbit._parallel import map_chunks

        flat = V2.reshape(-1)
        cuts = range(0, m, _SEGMENT)

        def seg(a: int) -> int:
            part = np.empty(1, dtype=np.uint32)
            _row_absmax_kernel(flat[a : a + _SEGMENT].reshape(1, -1), part)
            return int(part[0])

        bits[0] = max(map_chunks(seg, list(cuts)))
    else:
        _row_absmax_kernel(V2, bits)
    return bits.view(np.float32).astype(np.float64).reshape(*V.shape[:-1], 1)
