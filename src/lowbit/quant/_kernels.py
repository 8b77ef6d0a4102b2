"""The compiled quantizer kernels (numba), for ``lowbit.quant._numba``.

Importing this module imports numba; ``lowbit.quant._numba`` chooses and parameterises the
kernels and imports this module on first use, so ``lowbit.quant`` loads without numba.
Kernels are built per layout on first use (``_built``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from lowbit.codecs._kernels import (
    _GENERIC,
    _SIGNED,
    _bits32,
    _bits64,
    _finish,
    _round32,
    _round64,
)

__all__: list[str] = []  # internal: used by lowbit.quant._numba only

_BLOCK = 256  # elements per edge-check block of long rows (a redo rescans one block)

_KERNELS: dict[tuple[Any, ...], Any] = {}


def _built(key: tuple[Any, ...], build: Any) -> Any:
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = build()
    return k


def _int_kernel() -> Any:
    """float32 data: clip(round(v / s), lo, hi), the float32 quotient rounded half-even,
    its ties re-done on the float64 quotient (exact for float32 operands) with ``away``
    choosing ties away from zero, as the numpy path (row mode)."""

    def build() -> Any:
        @njit(cache=True, nogil=True)
        def kernel(x, offs, m, s2, srow, out, away, lo, hi, mask):  # type: ignore[no-untyped-def]
            for r in range(offs.size):
                v = x[offs[r] : offs[r] + m]
                o = out[r * m : (r + 1) * m]
                sr = s2[srow[r], 0]
                tie = False
                for j in range(m):  # branch-free, so it vectorises
                    t = np.float32(v[j] / sr)
                    q = np.float64(np.rint(t))
                    tie |= abs(np.float64(t) - q) == 0.5
                    q = min(max(q, lo), hi)
                    o[j] = np.uint8(np.int64(q) & mask)
                if not tie:
                    continue
                for j in range(m):  # a row with a tie of the float32 quotient: redo those
                    t = np.float32(v[j] / sr)
                    if abs(np.float64(t) - np.float64(np.rint(t))) != 0.5:
                        continue
                    t64 = np.float64(v[j]) / np.float64(sr)
                    q = np.rint(t64)
                    if away:
                        fl = np.floor(t64)
                        if t64 - fl == 0.5:
                            q = fl + 1.0 if t64 > 0 else fl
                    q = min(max(q, lo), hi)
                    o[j] = np.uint8(np.int64(q) & mask)

        return kernel

    return _built(("int",), build)


def _int64_kernel() -> Any:
    """float64 data: the float64 quotient rounded half-even; where it is exactly half way
    (a true tie, or one the division made) the index goes to ``ties`` for the exact
    quotient. The kernel returns how many, or -1 when ``ties`` is full (row mode)."""

    def build() -> Any:
        @njit(cache=True, nogil=True)
        def kernel(x, offs, m, s2, srow, out, lo, hi, mask, ties):  # type: ignore[no-untyped-def]
            nt = 0
            for r in range(offs.size):
                v = x[offs[r] : offs[r] + m]
                o = out[r * m : (r + 1) * m]
                sr = np.float64(s2[srow[r], 0])
                tie = False
                for j in range(m):  # branch-free, so it vectorises
                    t = v[j] / sr
                    q = np.rint(t)
                    tie |= abs(t - q) == 0.5
                    q = min(max(q, lo), hi)
                    o[j] = np.uint8(np.int64(q) & mask)
                if not tie:
                    continue
                for j in range(m):
                    t = v[j] / sr
                    if abs(t - np.rint(t)) == 0.5:
                        if nt == ties.size:
                            return -1
                        ties[nt] = r * m + j
                        nt += 1
            return nt

        return kernel

    return _built(("int64",), build)


def _float_kernel(mode: int, kind: int) -> Any:
    """float32 data onto a small float format: the float32 quotient rounded by the
    codec's float32 core; a block holding a quotient whose low bits are all zero (maybe a
    boundary) redoes those from the float64 quotient. ``mode`` (0 even, 1 away) and
    ``kind`` are compile-time constants, so the first pass vectorises (row mode)."""

    def build() -> Any:
        @njit(cache=True, nogil=True)
        def kernel(x, offs, m, s2, srow, out, P, T, P64, lowmask):  # type: ignore[no-untyped-def]
            maxc = T[0]
            maxc32 = np.int32(maxc)
            sbit = np.uint32(T[1])
            keeps = T[2] != 0
            low = np.uint32(lowmask)
            zero = np.uint32(0)
            for r in range(offs.size):
                sr = s2[srow[r], 0]
                for j0 in range(0, m, _BLOCK):
                    n = min(_BLOCK, m - j0)
                    # 1-D slices: indexing with an offset stops vectorising
                    v = x[offs[r] + j0 : offs[r] + j0 + n]
                    o = out[r * m + j0 : r * m + j0 + n]
                    edge = False
                    for j in range(n):
                        t = np.float32(v[j] / sr)
                        mag, neg, u, isnan, isinf = _round32(t, P, mode, kind)
                        if kind == _SIGNED:  # no NaN here, saturating: clamp, then the sign
                            mag = min(mag, maxc32)
                            keep = (mag != np.int32(0)) | keeps
                            c = np.uint32(mag) | (sbit if neg & keep else zero)
                        else:
                            c = _finish(mag, neg, u != zero, isnan, isinf, T, mode, kind)
                        o[j] = np.uint8(c)
                        edge |= (_bits32(t) & low) == zero
                    if not edge:
                        continue
                    for j in range(n):  # maybe a boundary: round the float64 quotient
                        t = np.float32(v[j] / sr)
                        if (_bits32(t) & low) != zero:
                            continue
                        w = _bits64(np.float64(v[j]) / np.float64(sr))
                        mag, neg, u, isnan, isinf = _round64(w, np.uint64(0), P64, mode, maxc)
                        c = _finish(mag, neg, u != np.uint64(0), isnan, isinf, T, mode, _GENERIC)
                        o[j] = np.uint8(c)

        return kernel

    return _built(("float", mode, kind), build)


def _float64_kernel(mode: int) -> Any:
    """float64 data onto a small float format: the float64 quotient is what the codec
    rounds, so every element goes through the float64 core once (row mode)."""

    def build() -> Any:
        @njit(cache=True, nogil=True)
        def kernel(x, offs, m, s2, srow, out, T, P64):  # type: ignore[no-untyped-def]
            maxc = T[0]
            for r in range(offs.size):
                sr = np.float64(s2[srow[r], 0])
                v = x[offs[r] : offs[r] + m]
                o = out[r * m : (r + 1) * m]
                for j in range(m):
                    w = _bits64(v[j] / sr)
                    mag, neg, u, isnan, isinf = _round64(w, np.uint64(0), P64, mode, maxc)
                    c = _finish(mag, neg, u != np.uint64(0), isnan, isinf, T, mode, _GENERIC)
                    o[j] = np.uint8(c)

        return kernel

    return _built(("float64", mode), build)


def _valueset_kernel(cols: bool) -> Any:
    """Codes from the bin table (``k2``: bins per unit of the quotient, per scale); the
    (row, block start) pairs holding a risky bin go to ``flagged``; returns how many."""

    def build() -> Any:
        @njit(cache=True, nogil=True)
        def kernel(x, offs, m, k2, srow, out, table, lo_w, flagged):  # type: ignore[no-untyped-def]
            top = np.float32(table.size - 1)
            nb = min(m, _BLOCK)
            bins = np.empty(nb, dtype=np.int32)
            nf = 0
            for r in range(offs.size):
                kv = k2[srow[r]]
                kr = kv[0]
                for j0 in range(0, m, nb):
                    n = min(nb, m - j0)
                    v = x[offs[r] + j0 : offs[r] + j0 + n]
                    o = out[r * m + j0 : r * m + j0 + n]
                    kb = kv[j0 : j0 + n] if cols else kv
                    for j in range(n):  # vectorises: the bin index of each quotient
                        b = np.float32(v[j] * (kb[j] if cols else kr)) - lo_w
                        bins[j] = np.int32(min(max(b, np.float32(0)), top))
                    risky = np.uint8(0)
                    for j in range(n):
                        c = table[bins[j]]
                        o[j] = c & np.uint8(127)
                        risky |= c
                    if risky >= np.uint8(128):
                        flagged[nf, 0] = r
                        flagged[nf, 1] = j0
                        nf += 1
            return nf

        return kernel

    return _built(("valueset", cols), build)


@njit(cache=True, nogil=True)
def _valueset_redo(x, offs, m, s2, k2, srow, cstep, out, table, mids, lo_w, flagged, nf, ties):  # type: ignore[no-untyped-def]
    """The flagged blocks' risky elements: count the midpoints below the float64
    quotient (scale ``s2[srow[r], j * cstep]``); exact ties go to ``ties`` (indices
    into ``out``). Return how many, or -1 when ``ties`` is full."""
    top = np.float32(table.size - 1)
    nb = min(m, _BLOCK)
    nt = 0
    for f in range(nf):
        r = flagged[f, 0]
        row = srow[r]
        for j in range(flagged[f, 1], min(flagged[f, 1] + nb, m)):
            v = x[offs[r] + j]
            b = np.float32(v * k2[row, j * cstep]) - lo_w
            if table[np.int32(min(max(b, np.float32(0)), top))] < np.uint8(128):
                continue
            t = np.float64(v) / np.float64(s2[row, j * cstep])
            c = 0
            for q in range(mids.size):
                c += t > mids[q]
                if t == mids[q]:
                    if nt == ties.size:
                        return -1
                    ties[nt] = r * m + j
                    nt += 1
            out[r * m + j] = c
    return nt


def _dequant_kernel(cols: bool) -> Any:
    """Row ``r`` of ``y``: ``(table[code] - z) * s`` in the table's dtype."""

    def build() -> Any:
        @njit(cache=True, nogil=True)
        def kernel(codes, table, s2, z2, has_z, y, offs, m, srow):  # type: ignore[no-untyped-def]
            for r in range(offs.size):
                c = codes[r * m : (r + 1) * m]
                o = y[offs[r] : offs[r] + m]
                sv = s2[srow[r]]
                sr = sv[0]
                if has_z:
                    zv = z2[srow[r]]
                    zr = zv[0]
                    for j in range(m):
                        zj = zv[j] if cols else zr
                        o[j] = (table[c[j]] - zj) * (sv[j] if cols else sr)
                else:
                    for j in range(m):
                        o[j] = table[c[j]] * (sv[j] if cols else sr)

        return kernel

    return _built(("dequant", cols), build)


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


@njit(cache=True, nogil=True)
def _row_absmax_kernel(u, offs, m, mask, out):  # type: ignore[no-untyped-def]
    """Largest magnitude bit pattern of each row of float bit patterns ``u`` (uint32
    or uint64; ``mask`` drops the sign). An integer max vectorises, and a NaN, whose
    pattern is above infinity's, comes out as a NaN."""
    for r in range(offs.size):
        v = u[offs[r] : offs[r] + m]
        acc = v[0] & mask
        for j in range(m):
            acc = max(acc, v[j] & mask)
        out[r] = acc


# ---- NVFP4 in one pass (``lowbit.quant._numba.nvfp4_encode``)

_F6 = np.float32(6.0)
_E4M3_MAX = np.float32(448.0)
_E4M3_MIN_NORMAL = np.float32(2.0**-6)
_E4M3_SUB_STEPS = np.float32(512.0)  # 2**9: E4M3's subnormal quantum is 2**-9
_MAGIC23 = np.float32(8388608.0)  # 2**23: adding and subtracting it rounds half to even


@njit(cache=True, inline="always")
def _e4m3_rne(v, word, bits):  # type: ignore[no-untyped-def]
    """``v`` (float32 in [0, 448]) rounded to E4M3 half to even, as a float32 value; ``word``
    a one-element float32 scratch and ``bits`` its uint32 view."""
    if v < _E4M3_MIN_NORMAL:  # subnormal steps of 2**-9: scaled exactly, rounded, scaled back
        return ((v * _E4M3_SUB_STEPS + _MAGIC23) - _MAGIC23) / _E4M3_SUB_STEPS
    word[0] = v
    b = bits[0]
    bits[0] = (b + np.uint32(0x7FFFF) + ((b >> np.uint32(20)) & np.uint32(1))) & np.uint32(
        0xFFF00000
    )
    return word[0]


@njit(cache=True, nogil=True, error_model="numpy")
def _nvfp4_kernel(x, g, packed, s_out, e_out):  # type: ignore[no-untyped-def]
    """NVFP4 of finite float32 rows ``x`` (R, C; C a multiple of 16) under tensor scale ``g``:
    each group's E4M3 scale ``RNE(min(float32(amax / 6) * g, 448))`` (0 made 0.125) into
    ``s_out``, what the codes multiply ``float32(s / g)`` into ``e_out`` (R, C // 16), and the
    codes of ``float32(x / e)`` two to a byte, the even element in the low nibble, into
    ``packed`` (R, C // 2). A code counts the E2M1 midpoints below ``|t|`` (ties to the even
    code: 0.25, 1.25, 2.5 and 5 round down, 0.75, 1.75 and 3.5 up; past 6 it saturates; either
    zero gives 0), with the sign bit where ``t < 0`` (served_codes' rule). Each row runs in
    passes whose loops vectorise: the groups' largest magnitudes as integer maxima of the
    words (finite floats order as their magnitude's bits), the scales, the codes, the bytes."""
    word = np.zeros(1, np.float32)
    bits = word.view(np.uint32)
    rows, cols = x.shape
    groups = cols // 16
    u = x.view(np.uint32)
    amax = np.zeros(groups, np.uint32)
    amax_f = amax.view(np.float32)
    e = np.zeros(groups, np.float32)
    codes = np.zeros(cols, np.uint8)
    for r in range(rows):
        for k in range(groups):
            m = np.uint32(0)
            for i in range(16):
                m = max(m, u[r, 16 * k + i] & np.uint32(0x7FFFFFFF))
            amax[k] = m
        for k in range(groups):
            v = min((amax_f[k] / _F6) * g, _E4M3_MAX)
            s = _e4m3_rne(v, word, bits)
            s = np.float32(0.125) if s == 0 else s
            s_out[r, k] = s
            e[k] = s / g
            e_out[r, k] = e[k]
        for k in range(groups):
            ek = e[k]
            for i in range(16):
                t = x[r, 16 * k + i] / ek
                m = abs(t)
                c = (
                    np.uint8(m > 0.25)
                    + np.uint8(m >= 0.75)
                    + np.uint8(m > 1.25)
                    + np.uint8(m >= 1.75)
                    + np.uint8(m > 2.5)
                    + np.uint8(m >= 3.5)
                    + np.uint8(m > 5.0)
                )
                codes[16 * k + i] = c | (np.uint8(8) * np.uint8(t < 0))
        for j in range(cols // 2):
            packed[r, j] = codes[2 * j] | (codes[2 * j + 1] << np.uint8(4))


# ---- llama.cpp's Q4_0 / Q4_1 / Q8_0 blocks (``lowbit.quant._numba.ggml_decode`` / ``ggml_encode``)
