"""Compiled (numba) searches of the i-quants below 4 bits, bit for bit the numpy paths.

``lattice_trials`` is the scale search and final pass of ``_search`` in
:mod:`lowbit.ggml.iq_lattice` (IQ2_XXS/XS/S, IQ3_XXS/S) and ``iq1_blocks`` the whole per-block
search of :mod:`lowbit.ggml.iq1` (IQ1_S/IQ1_M): the C loops of ggml-quants.c one block at a
time, every operation in float32 (constants and integer-to-float conversions made float32
explicitly; numba does not fuse multiply-adds without ``fastmath``). ``tests/ggml`` compares
them with the numpy paths byte for byte. Importing this module imports numba.
"""

from __future__ import annotations

import numba
import numpy as np

from lowbit.ggml._search_kernels import _nearest_int

__all__: list[str] = []  # internal: lowbit.ggml.iq_lattice and lowbit.ggml.iq1 use them

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_TWO = np.float32(2.0)
_FMAX = np.float32(3.4028234663852886e38)


@numba.njit(cache=True, inline="always")
def _snap(x, w, off, dims, bits, scale, lev, kmap, nb_start, nb_count, nb_flat, pos, levels):
    """Levels ``lev[off:off+dims]`` to a grid point (in place); returns whether on the grid."""
    u = 0
    for i in range(dims):
        u |= lev[off + i] << (bits * i)
    if kmap[u] >= 0:
        return True
    best = _FMAX
    gbest = -1
    s = nb_start[u]
    for j in range(nb_count[u]):
        c = nb_flat[s + j]
        d2 = _ZERO
        for i in range(dims):
            diff = scale * pos[c, i] - x[off + i]
            d2 += (w[off + i] * diff) * diff
        if d2 < best:
            best = d2
            gbest = c
    if gbest < 0:  # every distance infinite (C would abort): the first neighbour
        gbest = nb_flat[s]
    for i in range(dims):
        lev[off + i] = levels[gbest, i]
    return False


@numba.njit(cache=True, nogil=True)
def lattice_trials(
    xval, w, waux, base, scale0, zero, kmaxq, tries, step, final_mode, ongrid_init, dims, bits,
    kmap, nb_start, nb_count, nb_flat, pos, levels,
):  # fmt: skip
    """The trials ``id = (2*kmaxq-1 + is*step)/base`` and the final pass (final_mode 0 every
    group, 1 the groups off the grid, 2 every group when any is off) of each block (row):
    (scale (G,), levels (G, n))."""
    g, n = xval.shape
    ng = n // dims
    scales = np.zeros(g, np.float32)
    out = np.zeros((g, n), np.int64)
    lev = np.zeros(n, np.int64)
    laux = np.zeros(n, np.int64)
    on = np.zeros(ng, np.bool_)
    onaux = np.zeros(ng, np.bool_)
    top = kmaxq - 1
    c = np.float32(2 * kmaxq - 1)
    scratch = np.zeros(1, np.float32)
    for b in range(g):
        if zero[b]:
            continue
        x = xval[b]
        wb = w[b]
        wa = waux[b]
        best = _ZERO
        scale = scale0[b]
        lev[:] = 0
        on[:] = ongrid_init
        for it in range(-tries, tries + 1):
            ident = (c + np.float32(it) * step) / base[b]
            this = _ONE / ident
            for i in range(n):
                lv = _nearest_int(_HALF * (ident * x[i] - _ONE), scratch)
                laux[i] = max(0, min(top, lv))
            for k in range(ng):
                onaux[k] = _snap(x, wa, k * dims, dims, bits, this, laux, kmap, nb_start,
                                 nb_count, nb_flat, pos, levels)  # fmt: skip
            sumqx = _ZERO
            sumq2 = _ZERO
            for i in range(n):
                q = np.float32(2 * laux[i] + 1)
                sumqx += (wb[i] * x[i]) * q
                sumq2 += (wb[i] * q) * q
            if sumq2 > _ZERO and sumqx * sumqx > best * sumq2:
                scale = sumqx / sumq2
                best = scale * sumqx
                lev[:] = laux
                on[:] = onaux
        anyoff = False
        for k in range(ng):
            if not on[k]:
                anyoff = True
        if (final_mode == 0 or anyoff) and scale > _ZERO:
            ident = _ONE / scale
            for k in range(ng):
                if final_mode == 1 and on[k]:
                    continue
                for i in range(k * dims, (k + 1) * dims):
                    lv = _nearest_int(_HALF * (ident * x[i] - _ONE), scratch)
                    lev[i] = max(0, min(top, lv))
                _snap(x, wa, k * dims, dims, bits, scale, lev, kmap, nb_start, nb_count,
                      nb_flat, pos, levels)  # fmt: skip
            sumqx = _ZERO
            sumq2 = _ZERO
            for i in range(n):
                q = np.float32(2 * lev[i] + 1)
                sumqx += (wb[i] * x[i]) * q
                sumq2 += (wb[i] * q) * q
            if sumq2 > _ZERO:
                scale = sumqx / sumq2
        scales[b] = scale
        out[b] = lev
    return scales, out


@numba.njit(cache=True, nogil=True)
def iq1_blocks(xb, w, is_m, eps, xp, xm, kmap, nb_start, nb_count, nb_flat, levels):
    """IQ1_S (is_m False, blocks of 32) / IQ1_M (16) per-block search: (scale, shift code,
    grid indices (G, n/8), zero)."""
    g, n = xb.shape
    ng = n // 8
    scales = np.zeros(g, np.float32)
    codes = np.zeros(g, np.int64)
    gis = np.zeros((g, ng), np.int64)
    zero = np.zeros(g, np.bool_)
    order = np.zeros(n, np.int64)
    px = np.zeros((2, n + 1), np.float32)
    pw = np.zeros((2, n + 1), np.float32)
    lev = np.zeros(n, np.int64)
    xxg = np.zeros((ng, 3), np.float32)
    sqx = np.zeros(4, np.float32)
    sq2 = np.zeros(4, np.float32)
    p2 = xp[2]
    m2 = xm[2]
    cp1 = xp[0] * xp[0] - xp[1] * xp[1]
    cp2 = xp[1] * xp[1] - xp[2] * xp[2]
    cm1 = xm[0] * xm[0] - xm[1] * xm[1]
    cm2 = xm[1] * xm[1] - xm[2] * xm[2]
    for b in range(g):
        x = xb[b]
        wb = w[b]
        amax = abs(x[0])
        for i in range(1, n):
            amax = max(amax, abs(x[i]))
        if amax < eps:
            zero[b] = True
            codes[b] = 0 if is_m else 1
            continue
        for i in range(n):  # stable insertion sort by value (glibc's merge sort keeps ties)
            order[i] = i
        for i in range(1, n):
            j = i
            while j > 0 and x[order[j]] < x[order[j - 1]]:
                order[j], order[j - 1] = order[j - 1], order[j]
                j -= 1
        px[:, 0] = _ZERO
        pw[:, 0] = _ZERO
        for j in range(n):
            i = order[j]
            h = 0 if (not is_m or i < n // 2) else 1
            px[h, j + 1] = px[h, j] + wb[i] * x[i]
            pw[h, j + 1] = pw[h, j] + wb[i]
            px[1 - h, j + 1] = px[1 - h, j]
            pw[1 - h, j + 1] = pw[1 - h, j]
        best = -_FMAX
        scale = _ZERO
        bi1 = -1
        bi2 = -1
        code = 0 if not is_m else -1
        for i1 in range(n + 1):
            for i2 in range(i1, n + 1):
                if not is_m:
                    a = px[0, i1]
                    bb = px[0, i2] - px[0, i1]
                    cc = px[0, n] - px[0, i2]
                    wa = pw[0, i1]
                    wbb = pw[0, i2] - pw[0, i1]
                    wc = pw[0, n] - pw[0, i2]
                    for s in range(2):
                        xx = xp if s == 0 else xm
                        sumqx = (a * xx[0] + bb * xx[1]) + cc * xx[2]
                        sumq2 = ((wa * xx[0]) * xx[0] + (wbb * xx[1]) * xx[1]) + (wc * xx[2]) * xx[
                            2
                        ]
                        if sumq2 > _ZERO and sumqx * sumqx > best * sumq2:
                            scale = sumqx / sumq2
                            best = scale * sumqx
                            bi1 = i1
                            bi2 = i2
                            code = 1 if s == 0 else -1
                else:
                    sx0 = px[0, i1] + px[0, i2]
                    sx1 = px[1, i1] + px[1, i2]
                    qxp0 = px[0, n] * p2 - sx0
                    qxm0 = px[0, n] * m2 - sx0
                    qxp1 = px[1, n] * p2 - sx1
                    qxm1 = px[1, n] * m2 - sx1
                    q2p0 = ((pw[0, n] * p2) * p2 + pw[0, i1] * cp1) + pw[0, i2] * cp2
                    q2m0 = ((pw[0, n] * m2) * m2 + pw[0, i1] * cm1) + pw[0, i2] * cm2
                    q2p1 = ((pw[1, n] * p2) * p2 + pw[1, i1] * cp1) + pw[1, i2] * cp2
                    q2m1 = ((pw[1, n] * m2) * m2 + pw[1, i1] * cm1) + pw[1, i2] * cm2
                    sqx[0] = qxp0 + qxp1
                    sqx[1] = qxp0 + qxm1
                    sqx[2] = qxm0 + qxp1
                    sqx[3] = qxm0 + qxm1
                    sq2[0] = q2p0 + q2p1
                    sq2[1] = q2p0 + q2m1
                    sq2[2] = q2m0 + q2p1
                    sq2[3] = q2m0 + q2m1
                    for k in range(4):
                        if sq2[k] > _ZERO and sqx[k] * sqx[k] > best * sq2[k]:
                            scale = sqx[k] / sq2[k]
                            best = scale * sqx[k]
                            bi1 = i1
                            bi2 = i2
                            code = k
        if bi1 < 0 or bi2 < 0 or (code == 0 if not is_m else code < 0):
            zero[b] = True
            codes[b] = 0 if is_m else 1
            continue
        for j in range(n):
            lev[order[j]] = 0 if j < bi1 else (1 if j < bi2 else 2)
        if scale < _ZERO:
            for j in range(n):
                lev[j] = 2 - lev[j]
            scale = -scale
            code = -code if not is_m else 3 - code
        for k in range(ng):
            minus = (code == -1) if not is_m else ((code >= 2) if k == 0 else (code % 2 == 1))
            for t in range(3):
                xxg[k, t] = xm[t] if minus else xp[t]
        allon = True
        for k in range(ng):
            u = 0
            for i in range(8):
                u |= lev[8 * k + i] << (2 * i)
            gi = kmap[u]
            if gi < 0:
                allon = False
                bestd = _FMAX
                s0 = nb_start[u]
                for j in range(nb_count[u]):
                    cnd = nb_flat[s0 + j]
                    d2 = _ZERO
                    for i in range(8):
                        diff = scale * xxg[k, levels[cnd, i]] - x[8 * k + i]
                        d2 += (wb[8 * k + i] * diff) * diff
                    if d2 < bestd:
                        bestd = d2
                        gi = cnd
                if gi < 0:
                    gi = nb_flat[s0]
            gis[b, k] = gi
        if not allon:
            sumqx = _ZERO
            sumq2 = _ZERO
            for k in range(ng):
                for i in range(8):
                    q = xxg[k, levels[gis[b, k], i]]
                    sumqx += (wb[8 * k + i] * q) * x[8 * k + i]
                    sumq2 += (wb[8 * k + i] * q) * q
            if sumqx > _ZERO and sumq2 > _ZERO:
                scale = sumqx / sumq2
        scales[b] = scale
        codes[b] = code
    return scales, codes, gis, zero
