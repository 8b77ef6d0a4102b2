"""llama.cpp's 1-bit i-quants IQ1_S and IQ1_M: super-blocks of 256 values to bytes and back.

Groups of 8 values are a point of a ternary grid (levels -1, 0, 1; ``kgrid_1bit_2048``,
:mod:`lowbit.ggml.iq_grids`) shifted by ``+-IQ1S_DELTA`` (0.125), times a block scale. The
encoders repeat ggml-quants.c's ``quantize_row_iq1_s_impl`` / ``quantize_row_iq1_m_impl``,
vectorised over blocks (32 values for IQ1_S, 16 for IQ1_M), in the C code's float32 order:

- weights ``qw * sqrtf(sigma2 + x*x)``, ``sigma2 = 2*sum(x*x)/256`` summed in order (IQ1_M
  without an importance vector: ``x*x``; IQ1_S needs one). A block whose largest ``|x|`` is
  below 1e-12 (IQ1_S) / 1e-7 (IQ1_M) is zero.
- the exhaustive split: the block's values sorted ascending by ``qsort`` with a float compare
  (glibc's ``qsort`` is a stable merge sort for arrays this small, so equal values keep their
  order: ``argsort(kind="stable")`` here; a libc whose ``qsort`` is not stable may give other
  bytes on ties), prefix sums of ``w*x`` and ``w`` in that order, then every split
  ``0 <= i1 <= i2 <= n`` into levels 0/1/2, each with both shifts (IQ1_S: ``x_p = (-0.875,
  0.125, 1.125)`` then ``x_m``; IQ1_M: four combinations of a shift per half, sums by the C
  code's rearranged formulas), kept when ``sumqx*sumqx > best*sumq2`` (best starts at
  ``-FLT_MAX``), ``scale = sumqx/sumq2``, ``best = scale*sumqx``.
- a negative scale flips the levels and the shift; a group off the grid goes to the neighbour
  with the smallest ``sum((w*(scale*xx[l] - x))*(...))`` (``iq1_find_best_neighbour2``), and
  then the scale is refitted when both sums are positive.
- IQ1_S: ``d = max_scale/15`` stored as float16 ``d*1.125f``, 3-bit scales
  ``nearest_int(0.5f*((1/d)*scale - 1))``, the shift in bit 15 of ``qh``. IQ1_M: the same
  3-bit scales from ``d = max_scale/15``, then ``d`` refitted over the whole super-block
  (``sumqx/sumq2`` with ``q = xx[l]*(2*scale+1)``) and stored as float16 ``d*1.1125f``, its
  16 bits in the top nibbles of the four uint16 scale words.

Layouts (ggml-common.h), little-endian:

- IQ1_S, 50 bytes: float16 ``d``, ``qs[32]`` (low 8 bits of each group's grid index),
  ``qh[8]`` uint16 per block of 32 (bits ``3k..3k+2``: high bits of group ``k``'s index, 12..14
  the scale, 15 the shift ``-delta``). Value ``d*(2*s+1) * (grid + delta)``.
- IQ1_M, 56 bytes: ``qs[32]``, ``qh[16]`` per block of 16 (low nibble: group 0's high 3 bits and
  its shift in 0x08; high nibble: group 1's), ``scales`` as four uint16 (3 bits per block of 16,
  four blocks a word; the top nibbles hold float16 ``d``).
"""

from __future__ import annotations

import numpy as np

from lowbit.ggml._search import F32, f16_bytes, nearest_int, read_f16, seqsum
from lowbit.ggml.iq_grids import decode_grid, lattice
from lowbit.ggml.iq_lattice import _kernels, use_kernels

QK_K = 256
BLOCK_BYTES = {"IQ1_S": 50, "IQ1_M": 56}
_DELTA = F32(0.125)
_XP = np.array([-1 + 0.125, 0.125, 1 + 0.125], dtype=F32)
_XM = np.array([-1 - 0.125, -0.125, 1 - 0.125], dtype=F32)
_FMAX = F32(np.finfo(np.float32).max)


def _rowsum(a: np.ndarray) -> np.ndarray:
    return seqsum(np.moveaxis(a, -1, 0))


def _weights(xs: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    if qw is None:
        return xs * xs
    sigma2 = (F32(2) * _rowsum(xs * xs)) / F32(QK_K)
    return qw * np.sqrt(sigma2[:, None] + xs * xs)


def _prefix(v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """(G, n+1): 0, then ``p[j+1] = p[j] + v[:, j]`` in float32 (where ``mask``: else ``p[j]``)."""
    g, n = v.shape
    p = np.zeros((g, n + 1), dtype=F32)
    for j in range(n):
        p[:, j + 1] = (
            p[:, j] + v[:, j] if mask is None else np.where(mask[:, j], p[:, j] + v[:, j], p[:, j])
        )
    return p


def _split_s(sx: np.ndarray, sw: np.ndarray) -> tuple:
    """IQ1_S's search over splits and the two shifts: (scale, i1, i2, shift +-1 / 0 none)."""
    g, n1 = sx.shape
    n = n1 - 1
    best = np.full(g, -_FMAX, dtype=F32)
    scale = np.zeros(g, dtype=F32)
    bi1 = np.full(g, -1)
    bi2 = np.full(g, -1)
    shift = np.zeros(g, dtype=np.int64)
    for i1 in range(n + 1):
        for i2 in range(i1, n + 1):
            a, b, c = sx[:, i1], sx[:, i2] - sx[:, i1], sx[:, n] - sx[:, i2]
            wa, wb, wc = sw[:, i1], sw[:, i2] - sw[:, i1], sw[:, n] - sw[:, i2]
            for sgn, xx in ((1, _XP), (-1, _XM)):
                sumqx = (a * xx[0] + b * xx[1]) + c * xx[2]
                sumq2 = ((wa * xx[0]) * xx[0] + (wb * xx[1]) * xx[1]) + (wc * xx[2]) * xx[2]
                take = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
                if take.any():
                    scale = np.where(take, sumqx / sumq2, scale).astype(F32)
                    best = np.where(take, scale * sumqx, best).astype(F32)
                    bi1 = np.where(take, i1, bi1)
                    bi2 = np.where(take, i2, bi2)
                    shift = np.where(take, sgn, shift)
    return scale, bi1, bi2, shift


def _split_m(px: list, pw: list) -> tuple:
    """IQ1_M's search over splits and the four shift pairs: (scale, i1, i2, k / -1 none)."""
    g, n1 = px[0].shape
    n = n1 - 1
    txs = [px[0][:, n], px[1][:, n]]
    tws = [pw[0][:, n], pw[1][:, n]]
    p2, m2 = _XP[2], _XM[2]
    cp1 = _XP[0] * _XP[0] - _XP[1] * _XP[1]
    cp2 = _XP[1] * _XP[1] - _XP[2] * _XP[2]
    cm1 = _XM[0] * _XM[0] - _XM[1] * _XM[1]
    cm2 = _XM[1] * _XM[1] - _XM[2] * _XM[2]
    best = np.full(g, -_FMAX, dtype=F32)
    scale = np.zeros(g, dtype=F32)
    bi1 = np.full(g, -1)
    bi2 = np.full(g, -1)
    bk = np.full(g, -1)
    for i1 in range(n + 1):
        for i2 in range(i1, n + 1):
            qxp, qxm, q2p, q2m = [], [], [], []
            for h in range(2):
                sx = px[h][:, i1] + px[h][:, i2]
                qxp.append(txs[h] * p2 - sx)
                qxm.append(txs[h] * m2 - sx)
                q2p.append(((tws[h] * p2) * p2 + pw[h][:, i1] * cp1) + pw[h][:, i2] * cp2)
                q2m.append(((tws[h] * m2) * m2 + pw[h][:, i1] * cm1) + pw[h][:, i2] * cm2)
            sqx = (qxp[0] + qxp[1], qxp[0] + qxm[1], qxm[0] + qxp[1], qxm[0] + qxm[1])
            sq2 = (q2p[0] + q2p[1], q2p[0] + q2m[1], q2m[0] + q2p[1], q2m[0] + q2m[1])
            for k in range(4):
                take = (sq2[k] > 0) & (sqx[k] * sqx[k] > best * sq2[k])
                if take.any():
                    scale = np.where(take, sqx[k] / sq2[k], scale).astype(F32)
                    best = np.where(take, scale * sqx[k], best).astype(F32)
                    bi1 = np.where(take, i1, bi1)
                    bi2 = np.where(take, i2, bi2)
                    bk = np.where(take, k, bk)
    return scale, bi1, bi2, bk


def _snap1(
    lev: np.ndarray, x: np.ndarray, w: np.ndarray, scale: np.ndarray, xx: np.ndarray
) -> np.ndarray:
    """Grid indices for groups of levels ``lev`` (N, 8); off the grid the neighbour of
    ``iq1_find_best_neighbour2`` (values ``xx[level]`` per group, ``xx`` (N, 3))."""
    lat = lattice("IQ1_S")
    u = (lev.astype(np.int64) << (2 * np.arange(8))).sum(axis=1)
    gi = lat.kmap[u].astype(np.int64)
    offs = np.flatnonzero(gi < 0)
    for a in range(0, offs.size, 1 << 14):  # batches bound the candidate arrays
        off = offs[a : a + (1 << 14)]
        uo = u[off]
        cnt = lat.nb_count[uo].astype(np.int64)
        seg = np.concatenate([[0], np.cumsum(cnt)[:-1]])
        rep = np.repeat(np.arange(off.size), cnt)
        cand = lat.nb_flat[lat.nb_start[uo][rep] + (np.arange(int(cnt.sum())) - seg[rep])]
        levs = lat.levels[cand]
        xr, wr, sr, tab = x[off][rep], w[off][rep], scale[off][rep], xx[off][rep]
        d2 = np.zeros(len(cand), dtype=F32)
        for i in range(8):
            q = np.take_along_axis(tab, levs[:, i : i + 1], axis=1)[:, 0]
            diff = sr * q - xr[:, i]
            d2 += (wr[:, i] * diff) * diff
        low = np.minimum.reduceat(d2, seg)
        # the first candidate of each list at its minimum (C keeps the first on ties)
        at = np.where(d2 == low[rep], np.arange(len(cand)), len(cand))
        gi[off] = cand[np.minimum.reduceat(at, seg)]
    return gi


def _blocks(xb: np.ndarray, w: np.ndarray, kind: str) -> tuple:
    """Search blocks ``xb`` (G, n): (scale, shift code, grid indices (G, n/8), the (G, n/8, 3)
    value tables ``xx`` of each group)."""
    if use_kernels(xb.size):
        lat = lattice("IQ1_S")
        eps = F32(1e-12) if kind == "IQ1_S" else F32(1e-7)
        scale, code, gi, zero = _kernels().iq1_blocks(
            xb, w, kind == "IQ1_M", eps, _XP, _XM, lat.kmap, lat.nb_start, lat.nb_count,
            lat.nb_flat, lat.levels,
        )  # fmt: skip
    else:
        scale, code, gi, zero = _blocks_numpy(xb, w, kind)
    n = xb.shape[1]
    if kind == "IQ1_S":
        minus = np.repeat((code == -1)[:, None], n // 8, axis=1)
    else:
        minus = np.stack([code >= 2, code % 2 == 1], axis=1)
    xx = np.where(minus[..., None], _XM, _XP)  # (G, n/8, 3)
    xx = np.where(zero[:, None, None], _XP, xx)
    return scale, code, gi, xx


def _blocks_numpy(xb: np.ndarray, w: np.ndarray, kind: str) -> tuple:
    """The numpy search of :func:`_blocks`: (scale, shift code, grid indices, zero)."""
    g, n = xb.shape
    eps = F32(1e-12) if kind == "IQ1_S" else F32(1e-7)
    zero = np.abs(xb).max(axis=1) < eps
    order = np.argsort(xb, axis=1, kind="stable")
    xs_, ws_ = np.take_along_axis(xb, order, 1), np.take_along_axis(w, order, 1)
    wx = ws_ * xs_
    if kind == "IQ1_S":
        scale, i1, i2, code = _split_s(_prefix(wx), _prefix(ws_))
        fail = (i1 < 0) | (i2 < 0) | (code == 0)
    else:
        half = order < n // 2
        px = [_prefix(wx, half), _prefix(wx, ~half)]
        pw = [_prefix(ws_, half), _prefix(ws_, ~half)]
        scale, i1, i2, code = _split_m(px, pw)
        fail = (i1 < 0) | (i2 < 0) | (code < 0)
    zero |= fail
    rank = np.arange(n)[None, :]
    lsorted = np.where(rank < i1[:, None], 0, np.where(rank < i2[:, None], 1, 2))
    lev = np.empty_like(lsorted)
    np.put_along_axis(lev, order, lsorted, 1)
    neg = scale < 0
    lev = np.where(neg[:, None], 2 - lev, lev)
    scale = np.where(neg, -scale, scale).astype(F32)
    if kind == "IQ1_S":
        code = np.where(neg, -code, code)
        minus = np.repeat((code == -1)[:, None], n // 8, axis=1)
    else:
        code = np.where(neg, 3 - code, code)
        minus = np.stack([code >= 2, code % 2 == 1], axis=1)
    xx = np.where(minus[..., None], _XM, _XP)  # (G, n/8, 3)
    ng = n // 8
    gi = _snap1(
        lev.reshape(-1, 8),
        xb.reshape(-1, 8),
        w.reshape(-1, 8),
        np.repeat(scale, ng),
        xx.reshape(-1, 3),
    ).reshape(g, ng)
    lat = lattice("IQ1_S")
    offgrid = (lat.kmap[(lev.reshape(g, ng, 8) << (2 * np.arange(8))).sum(axis=2)] < 0).any(axis=1)
    if offgrid.any():
        q = np.take_along_axis(xx, lat.levels[gi], axis=2).reshape(g, n)
        sumqx = _rowsum((w * q) * xb)
        sumq2 = _rowsum((w * q) * q)
        refit = offgrid & (sumqx > 0) & (sumq2 > 0)
        scale = np.where(refit, sumqx / sumq2, scale).astype(F32)
    scale = np.where(zero, F32(0), scale).astype(F32)
    code = np.where(zero, 1 if kind == "IQ1_S" else 0, code)
    gi = np.where(zero[:, None], 0, gi)
    return scale, code, gi, zero


def _fit_s(xs: np.ndarray, qw: np.ndarray | None) -> dict[str, np.ndarray]:
    nb = xs.shape[0]
    with np.errstate(all="ignore"):
        w = _weights(xs, qw)
        scale, code, gi, _ = _blocks(xs.reshape(-1, 32), w.reshape(-1, 32), "IQ1_S")
        scales = scale.reshape(nb, 8)
        max_scale = scales.max(axis=1)
        d = (max_scale / F32(15)).astype(F32)
        ident = F32(1) / d
        ls = np.clip(nearest_int(F32(0.5) * (ident[:, None] * scales - F32(1))), 0, 7)
    empty = max_scale == 0
    ls[empty] = 0
    minus = np.repeat(code.reshape(nb, 8) == -1, 4, axis=1) & ~empty[:, None]
    dh = np.where(empty, F32(0), d * F32(1.125)).astype(F32)
    return {"d": dh, "ls": ls, "minus": minus, "gi": gi.reshape(nb, 32), "empty": empty}


def _fit_m(xs: np.ndarray, qw: np.ndarray | None) -> dict[str, np.ndarray]:
    nb = xs.shape[0]
    with np.errstate(all="ignore"):
        w = _weights(xs, qw)
        scale, code, gi, xx = _blocks(xs.reshape(-1, 16), w.reshape(-1, 16), "IQ1_M")
        scales = scale.reshape(nb, 16)
        max_scale = scales.max(axis=1)
        d = (max_scale / F32(15)).astype(F32)
        ident = F32(1) / d
        ls = np.clip(nearest_int(F32(0.5) * (ident[:, None] * scales - F32(1))), 0, 7)
        lat = lattice("IQ1_S")
        q = np.take_along_axis(xx, lat.levels[gi], axis=2).reshape(nb, 16, 16)
        q = q * (F32(2) * ls[..., None] + F32(1)).astype(F32)
        wv = w.reshape(nb, 16, 16)
        xv = xs.reshape(nb, 16, 16)
        sumqx = _rowsum(((wv * q) * xv).reshape(nb, 256))
        sumq2 = _rowsum(((wv * q) * q).reshape(nb, 256))
        d = np.where(sumq2 > 0, sumqx / sumq2, d).astype(F32)
    empty = max_scale == 0
    dh = np.where(empty, F32(0), d * F32(1.1125)).astype(F32)
    mask = np.array([0x00, 0x80, 0x08, 0x88])[code.reshape(nb, 16)]
    minus = np.stack([mask & 0x08 != 0, mask & 0x80 != 0], axis=2).reshape(nb, 32)
    minus &= ~empty[:, None]
    return {"d": dh, "ls": ls, "minus": minus, "gi": gi.reshape(nb, 32), "empty": empty}


def fit_iq1(name: str, xs: np.ndarray, qw: np.ndarray | None) -> dict[str, np.ndarray]:
    """llama.cpp's search on super-blocks ``xs`` (B, 256), for GPTQ and the encoders.

    Args:
        name: ``"IQ1_S"`` or ``"IQ1_M"``.
        xs: float32 values (B, 256).
        qw: importance weights (B, 256), or None (IQ1_M only).

    Returns:
        ``d``: the float32 value stored as float16 (IQ1_S ``d*1.125``, IQ1_M its refitted
        ``d*1.1125``; 0 on an all-zero super-block), ``ls``: the 3-bit block scales (B, 8 / 16),
        ``minus``: each group of 8's shift is ``-IQ1S_DELTA`` (B, 32) bool, ``gi``: the search's
        grid indices (B, 32), ``empty``: the super-blocks that decode to zero (B,).
    """
    return _fit_s(xs, qw) if name == "IQ1_S" else _fit_m(xs, qw)


def pack_iq1(name: str, fit: dict[str, np.ndarray], gi: np.ndarray) -> np.ndarray:
    """The block bytes (B, 50 / 56) of ``fit``'s scales and shifts (:func:`fit_iq1`) with grid
    indices ``gi`` (B, 32)."""
    nb = gi.shape[0]
    empty, minus = fit["empty"], fit["minus"]
    qs = (gi & 255).astype(np.uint8)
    if name == "IQ1_S":
        ls = np.where(empty[:, None], 0, fit["ls"] | np.where(minus[:, ::4], 8, 0))
        h = ((gi.reshape(nb, 8, 4) >> 8) << (3 * np.arange(4))).sum(axis=2) | (ls << 12)
        return np.concatenate([f16_bytes(fit["d"]), qs, h.astype("<u2").view(np.uint8)], axis=1)
    gi2 = gi.reshape(nb, 16, 2)
    qh = (gi2[..., 0] >> 8) | ((gi2[..., 1] >> 8) << 4)
    qh = qh | np.where(minus[:, 0::2], 0x08, 0) | np.where(minus[:, 1::2], 0x80, 0)
    sc = (fit["ls"].reshape(nb, 4, 4) << (3 * np.arange(4))).sum(axis=2)
    s16 = f16_bytes(fit["d"]).view("<u2")[:, 0].astype(np.int64)
    top = np.stack([(s16 & 0xF) << 12, (s16 & 0xF0) << 8, (s16 & 0xF00) << 4, s16 & 0xF000], axis=1)
    sc = np.where(empty[:, None], 0, sc | top)
    return np.concatenate([qs, qh.astype(np.uint8), sc.astype("<u2").view(np.uint8)], axis=1)


def quantize_iq1_s(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` and importance weights ``(B, 256)`` -> IQ1_S bytes ``(B, 50)``."""
    fit = _fit_s(xs, qw)
    return pack_iq1("IQ1_S", fit, fit["gi"])


def quantize_iq1_m(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` (and optional importance weights) -> IQ1_M bytes ``(B, 56)``."""
    fit = _fit_m(xs, qw)
    return pack_iq1("IQ1_M", fit, fit["gi"])


def dequantize_iq1_s(b: np.ndarray) -> np.ndarray:
    """IQ1_S bytes ``(B, 50)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    d = read_f16(b, 0)
    qh = np.ascontiguousarray(b[:, 34:50]).view("<u2").astype(np.int64)
    dl = d[:, None] * (2 * ((qh >> 12) & 7) + 1).astype(F32)
    delta = np.where(qh & 0x8000, -_DELTA, _DELTA)
    hi = (qh[..., None] >> (3 * np.arange(4))) & 7
    gi = b[:, 2:34].astype(np.int64).reshape(nb, 8, 4) | (hi << 8)
    grid = decode_grid("IQ1_S")[gi]  # (nb, 8, 4, 8)
    return (dl[..., None, None] * (grid + delta[..., None, None])).reshape(nb, QK_K)


def dequantize_iq1_m(b: np.ndarray) -> np.ndarray:
    """IQ1_M bytes ``(B, 56)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    sc = np.ascontiguousarray(b[:, 48:56]).view("<u2").astype(np.int64)
    dbits = (
        (sc[:, 0] >> 12)
        | ((sc[:, 1] >> 8) & 0xF0)
        | ((sc[:, 2] >> 4) & 0xF00)
        | (sc[:, 3] & 0xF000)
    )
    d = dbits.astype(np.uint16).view(np.float16).astype(F32)
    s = ((sc[..., None] >> (3 * np.arange(4))) & 7).reshape(nb, 16)
    dl = d[:, None] * (2 * s + 1).astype(F32)  # (nb, 16)
    qh = b[:, 32:48].astype(np.int64)
    nib = np.stack([qh & 15, qh >> 4], axis=2)  # (nb, 16, 2)
    gi = b[:, :32].astype(np.int64).reshape(nb, 16, 2) | ((nib & 7) << 8)
    delta = np.where(nib & 8, -_DELTA, _DELTA)
    grid = decode_grid("IQ1_S")[gi]  # (nb, 16, 2, 8)
    return (dl[..., None, None] * (grid + delta[..., None])).reshape(nb, QK_K)
