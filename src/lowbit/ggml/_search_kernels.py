"""Compiled (numba) forms of the hottest searches of lowbit.ggml (K-quants, IQ4), bit for bit.

``qkx_quants`` is ``make_qkx2_quants`` / ``make_qkx3_quants``, ``qx_quants`` is
``make_qx_quants`` (rmse_type 1) and ``q3_quants`` is ``make_q3_quants``: the C loops of
ggml-quants.c with every operation in float32 (constants and integer-to-float conversions made
float32 explicitly; numba does not fuse multiply-adds without ``fastmath``). They take and
return the numpy functions' arrays, one group per *column*, and search ``_LANES`` neighbouring
groups side by side so that the loops vectorise; ``iq4_block_scales`` is the per-32 scale search of ``quantize_row_iq4_nl_impl`` (with
``best_index_int8``). ``tests/ggml`` compares both paths bit for bit.
"""

from __future__ import annotations

import numba
import numpy as np

F32 = np.float32
_MAGIC = np.float32(12582912.0)
_EPS = np.float32(1e-15)
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_MANTISSA = np.int32(0x007FFFFF)
_HALF_MANTISSA = np.int32(0x00400000)
_TENTH = np.float32(0.1)


_RANGE = np.float32(4194304.0)  # 2**22: within it the sum's mantissa is the rounded integer


@numba.njit(cache=True, inline="always")
def _nearest_int(v: float, scratch: np.ndarray) -> int:
    """ggml's nearest_int for one value: the float32 sum with 1.5 * 2**23, its mantissa bits
    read back (within +-2**22 that is the sum minus 1.5 * 2**23, exactly; beyond, the bits)."""
    if abs(v) < _RANGE:
        return int((v + _MAGIC) - _MAGIC)
    scratch[0] = v + _MAGIC
    bits = scratch.view(np.int32)[0]
    return (bits & 0x007FFFFF) - 0x00400000


#: Groups searched side by side: one SIMD lane each (16 float32 lanes is one AVX-512 register,
#: two AVX2 ones). Each lane keeps its own sums, accumulated in the C loop's order, so lanes
#: change nothing in the bits; they only let LLVM vectorise over groups, which a group's
#: ordered sums forbid.
_LANES = 64


@numba.njit(cache=True, inline="always")
def _tile(src, g0, m, dst):
    """Columns ``g0 .. g0+m`` of ``src`` into ``dst (n, _LANES)``, the last one repeated into the
    unused lanes (a valid group, so every lane computes; only ``m`` are written back)."""
    for i in range(src.shape[0]):
        for t in range(_LANES):
            dst[i, t] = src[i, g0 + min(t, m - 1)]


@numba.njit(cache=True, inline="always")
def _codes(fbuf, ibuf, lo, hi, out, i):
    """``out[i, t] = clamp(nearest_int(v), lo, hi)`` for the lanes whose ``v + 1.5 * 2**23``
    is in ``fbuf`` (``ibuf`` its int32 view): the mantissa-bits trick of C, branch-free, so that
    values beyond +-2**22 give C's garbage and the loop still vectorises."""
    lo32 = np.int32(lo)
    hi32 = np.int32(hi)
    for t in range(_LANES):
        out[i, t] = min(max((ibuf[t] & _MANTISSA) - _HALF_MANTISSA, lo32), hi32)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def qkx_quants(x, w, nmax, rmin, rdelta, nstep, use_mad, x3):
    """make_qkx2_quants (x3 False) / make_qkx3_quants (x3 True) on groups ``x[:, g]``.

    Columns in, as the numpy function takes them: returns ``(scale (G,), L (n, G), -min (G,))``.
    """
    n, groups = x.shape
    T = _LANES
    scales = np.zeros(groups, np.float32)
    mins = np.zeros(groups, np.float32)
    codes = np.zeros((n, groups), np.int32)
    xt = np.zeros((n, T), np.float32)
    wt = np.zeros((n, T), np.float32)
    laux = np.zeros((n, T), np.int32)
    first = np.zeros((n, T), np.int32)
    fbuf = np.zeros(T, np.float32)
    ibuf = fbuf.view(np.int32)
    lo = np.zeros(T, np.float32)
    hi = np.zeros(T, np.float32)
    sum_w = np.zeros(T, np.float32)
    sum_x = np.zeros(T, np.float32)
    iscale = np.zeros(T, np.float32)
    scale = np.zeros(T, np.float32)
    best = np.zeros(T, np.float32)
    sum_l = np.zeros(T, np.float32)
    sum_l2 = np.zeros(T, np.float32)
    sum_xl = np.zeros(T, np.float32)
    t_scale = np.zeros(T, np.float32)
    t_min = np.zeros(T, np.float32)
    cur = np.zeros(T, np.float32)
    ok = np.zeros(T, np.bool_)
    flat = np.zeros(T, np.bool_)
    take = np.zeros(T, np.bool_)
    fn = np.float32(nmax)
    f_rmin = np.float32(rmin)
    f_rdelta = np.float32(rdelta)
    for g0 in range(0, groups, T):
        m = min(T, groups - g0)
        _tile(x, g0, m, xt)
        _tile(w, g0, m, wt)
        for t in range(T):
            lo[t] = xt[0, t]
            hi[t] = xt[0, t]
            sum_w[t] = wt[0, t]
            sum_x[t] = sum_w[t] * xt[0, t]
        for i in range(1, n):
            for t in range(T):
                xi = xt[i, t]
                lo[t] = xi if xi < lo[t] else lo[t]
                hi[t] = xi if xi > hi[t] else hi[t]
                sum_w[t] += wt[i, t]
                sum_x[t] += wt[i, t] * xi
        for t in range(T):
            lo[t] = _ZERO if lo[t] > _ZERO else lo[t]
            flat[t] = (hi[t] <= lo[t]) if x3 else (hi[t] == lo[t])
            iscale[t] = fn / (hi[t] - lo[t])
            scale[t] = _ONE / iscale[t]
            best[t] = _ZERO
        for i in range(n):
            for t in range(T):
                fbuf[t] = iscale[t] * (xt[i, t] - lo[t]) + _MAGIC
            _codes(fbuf, ibuf, 0, nmax, first, i)
            for t in range(T):
                diff = scale[t] * np.float32(first[i, t]) + lo[t] - xt[i, t]
                diff = abs(diff) if use_mad else diff * diff
                best[t] += wt[i, t] * diff
        for step in range(nstep + 1):
            for t in range(T):
                iscale[t] = (f_rmin + f_rdelta * np.float32(step) + fn) / (hi[t] - lo[t])
                sum_l[t] = _ZERO
                sum_l2[t] = _ZERO
                sum_xl[t] = _ZERO
            for i in range(n):
                for t in range(T):
                    fbuf[t] = iscale[t] * (xt[i, t] - lo[t]) + _MAGIC
                _codes(fbuf, ibuf, 0, nmax, laux, i)
                for t in range(T):
                    wl = wt[i, t] * np.float32(laux[i, t])
                    sum_l[t] += wl
                    sum_l2[t] += wl * np.float32(laux[i, t])
                    sum_xl[t] += wl * xt[i, t]
            for t in range(T):
                det = sum_w[t] * sum_l2[t] - sum_l[t] * sum_l[t]
                ok[t] = det > _ZERO
                a = (sum_w[t] * sum_xl[t] - sum_x[t] * sum_l[t]) / det
                b = (sum_l2[t] * sum_x[t] - sum_l[t] * sum_xl[t]) / det
                pos = b > _ZERO
                t_min[t] = _ZERO if pos else b
                t_scale[t] = sum_xl[t] / sum_l2[t] if pos else a
                cur[t] = _ZERO
            for i in range(n):
                for t in range(T):
                    diff = t_scale[t] * np.float32(laux[i, t]) + t_min[t] - xt[i, t]
                    diff = abs(diff) if use_mad else diff * diff
                    cur[t] += wt[i, t] * diff
            taken = False
            for t in range(T):
                take[t] = ok[t] and cur[t] < best[t] and not flat[t]
                taken = taken or take[t]
                best[t] = cur[t] if take[t] else best[t]
                scale[t] = t_scale[t] if take[t] else scale[t]
                lo[t] = t_min[t] if take[t] else lo[t]
            if taken:
                for i in range(n):
                    for t in range(T):
                        first[i, t] = laux[i, t] if take[t] else first[i, t]
        for t in range(m):
            scales[g0 + t] = _ZERO if flat[t] else scale[t]
            mins[g0 + t] = -lo[t]
        for i in range(n):
            for t in range(m):
                codes[i, g0 + t] = 0 if flat[t] else first[i, t]
    return scales, codes, mins


@numba.njit(cache=True, inline="always")
def _absmax_lanes(x, amax, vmax):
    """The largest ``|x|`` of each lane's group and the value with its sign (first on ties)."""
    for t in range(_LANES):
        amax[t] = _ZERO
        vmax[t] = _ZERO
    for i in range(x.shape[0]):
        for t in range(_LANES):
            ax = abs(x[i, t])
            bigger = ax > amax[t]
            vmax[t] = x[i, t] if bigger else vmax[t]
            amax[t] = ax if bigger else amax[t]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def qx_quants(x, nmax, qw, has_qw):
    """make_qx_quants(n, nmax, x, L, rmse_type=1, qw or x*x) on groups ``x[:, g]``.

    Columns in and out: returns ``(scale (G,), L (n, G) in 0..2*nmax-1)``.
    """
    n, groups = x.shape
    T = _LANES
    scales = np.zeros(groups, np.float32)
    codes = np.zeros((n, groups), np.int32)
    xt = np.zeros((n, T), np.float32)
    qt = np.zeros((n, T), np.float32)
    laux = np.zeros((n, T), np.int32)
    first = np.zeros((n, T), np.int32)
    fbuf = np.zeros(T, np.float32)
    ibuf = fbuf.view(np.int32)
    amax = np.zeros(T, np.float32)
    vmax = np.zeros(T, np.float32)
    iscale = np.zeros(T, np.float32)
    sumlx = np.zeros(T, np.float32)
    suml2 = np.zeros(T, np.float32)
    scale = np.zeros(T, np.float32)
    best = np.zeros(T, np.float32)
    take = np.zeros(T, np.bool_)
    fn = np.float32(nmax)
    for g0 in range(0, groups, T):
        m = min(T, groups - g0)
        _tile(x, g0, m, xt)
        if has_qw:
            _tile(qw, g0, m, qt)
        _absmax_lanes(xt, amax, vmax)
        for step in range(-10, 10):
            # step -10 is C's first rounding at -nmax / max; 0 is not a step of C's loop
            if step == 0:
                continue
            for t in range(T):
                if step == -10:
                    iscale[t] = np.float32(-nmax) / vmax[t]
                else:
                    iscale[t] = -(fn + _TENTH * np.float32(step)) / vmax[t]
                sumlx[t] = _ZERO
                suml2[t] = _ZERO
            for i in range(n):
                for t in range(T):
                    fbuf[t] = iscale[t] * xt[i, t] + _MAGIC
                _codes(fbuf, ibuf, -nmax, nmax - 1, laux, i)
                for t in range(T):
                    xi = xt[i, t]
                    wi = qt[i, t] if has_qw else xi * xi
                    lf = np.float32(laux[i, t])
                    sumlx[t] += wi * xi * lf
                    suml2[t] += wi * lf * lf
            taken = False
            for t in range(T):
                if step == -10:
                    take[t] = True
                    scale[t] = sumlx[t] / suml2[t] if suml2[t] != _ZERO else _ZERO
                    best[t] = scale[t] * sumlx[t]
                else:
                    take[t] = suml2[t] > _ZERO and sumlx[t] * sumlx[t] > best[t] * suml2[t]
                    scale[t] = sumlx[t] / suml2[t] if take[t] else scale[t]
                    best[t] = scale[t] * sumlx[t] if take[t] else best[t]
                taken = taken or take[t]
            if taken:
                for i in range(n):
                    for t in range(T):
                        first[i, t] = laux[i, t] if take[t] else first[i, t]
        for t in range(m):
            zero = amax[t] < _EPS
            scales[g0 + t] = _ZERO if zero else scale[t]
            take[t] = zero
        for i in range(n):
            for t in range(m):
                codes[i, g0 + t] = 0 if take[t] else first[i, t] + nmax
    return scales, codes


@numba.njit(cache=True, nogil=True, error_model="numpy")
def q3_quants(x, nmax):
    """make_q3_quants(n, nmax, x, L, do_rmse=true) on groups ``x[:, g]`` (weights ``x*x``).

    Columns in and out: returns ``(scale (G,), L (n, G) in 0..2*nmax-1)``. C stops a group's
    rounds once one changes nothing; a tile stops when none of its lanes changed (a round that
    changes nothing leaves the state as it was).
    """
    n, groups = x.shape
    T = _LANES
    scales = np.zeros(groups, np.float32)
    codes = np.zeros((n, groups), np.int32)
    xt = np.zeros((n, T), np.float32)
    lcode = np.zeros((n, T), np.int32)
    new = np.zeros((1, T), np.int32)
    fbuf = np.zeros(T, np.float32)
    ibuf = fbuf.view(np.int32)
    amax = np.zeros(T, np.float32)
    vmax = np.zeros(T, np.float32)
    iscale = np.zeros(T, np.float32)
    sumlx = np.zeros(T, np.float32)
    suml2 = np.zeros(T, np.float32)
    for g0 in range(0, groups, T):
        m = min(T, groups - g0)
        _tile(x, g0, m, xt)
        _absmax_lanes(xt, amax, vmax)
        for t in range(T):
            iscale[t] = np.float32(-nmax) / vmax[t]
            sumlx[t] = _ZERO
            suml2[t] = _ZERO
        for i in range(n):
            for t in range(T):
                fbuf[t] = iscale[t] * xt[i, t] + _MAGIC
            _codes(fbuf, ibuf, -nmax, nmax - 1, lcode, i)
            for t in range(T):
                xi = xt[i, t]
                wi = xi * xi
                lf = np.float32(lcode[i, t])
                sumlx[t] += wi * xi * lf
                suml2[t] += wi * lf * lf
        for _ in range(5):
            changed = False
            for i in range(n):
                for t in range(T):
                    xi = xt[i, t]
                    wi = xi * xi
                    li = np.float32(lcode[i, t])
                    slx = sumlx[t] - wi * xi * li
                    sl2 = suml2[t] - wi * li * li
                    fbuf[t] = xi * sl2 / slx + _MAGIC
                _codes(fbuf, ibuf, -nmax, nmax - 1, new, 0)
                for t in range(T):
                    xi = xt[i, t]
                    wi = xi * xi
                    li = np.float32(lcode[i, t])
                    slx = sumlx[t] - wi * xi * li
                    sl2 = suml2[t] - wi * li * li
                    nf = np.float32(new[0, t])
                    slx2 = slx + wi * xi * nf
                    sl22 = sl2 + wi * nf * nf
                    tk = (
                        slx > _ZERO
                        and new[0, t] != lcode[i, t]
                        and sl22 > _ZERO
                        and slx2 * slx2 * suml2[t] > sumlx[t] * sumlx[t] * sl22
                    )
                    changed = changed or tk
                    lcode[i, t] = new[0, t] if tk else lcode[i, t]
                    sumlx[t] = slx2 if tk else sumlx[t]
                    suml2[t] = sl22 if tk else suml2[t]
            if not changed:
                break
        for t in range(m):
            zero = amax[t] < _EPS
            s = sumlx[t] / suml2[t] if suml2[t] > _ZERO else _ZERO
            scales[g0 + t] = _ZERO if zero else s
            fbuf[t] = _ONE if zero else _ZERO
        for i in range(n):
            for t in range(m):
                codes[i, g0 + t] = 0 if fbuf[t] != _ZERO else lcode[i, t] + nmax
    return scales, codes


@numba.njit(cache=True, nogil=True, error_model="numpy")
def grid_codes(x, dd, dm, fallback, n, lo, hi, affine):
    """The K-quants' final rounding onto their stored grids, codes only: for value ``x[b, j]``
    of group ``k = j // n`` with ``d = dd[b, k]``, ``clamp(nearest_int((x + dm[b, k]) / d), 0,
    hi)`` (``affine``) or ``clamp(nearest_int(x / d), lo, hi) - lo``, and ``fallback[b, j]``
    where ``d`` is 0 (kquants.round_affine / round_symmetric, bit for bit)."""
    rows, c = x.shape
    out = np.empty((rows, c), np.int32)
    fbuf = np.zeros(c, np.float32)
    ibuf = fbuf.view(np.int32)
    lo32 = np.int32(lo)
    hi32 = np.int32(hi)
    for b in range(rows):
        for j in range(c):
            k = j // n
            v = (x[b, j] + dm[b, k]) if affine else x[b, j]
            fbuf[j] = v / dd[b, k] + _MAGIC
        for j in range(c):
            q = min(max((ibuf[j] & _MANTISSA) - _HALF_MANTISSA, lo32), hi32) - lo32
            out[b, j] = fallback[b, j] if dd[b, j // n] == _ZERO else q
    return out


@numba.njit(cache=True, inline="always")
def _best_index(values, x):
    """best_index_int8: the sorted table entry nearest x (ties up), compared in float32."""
    n = values.shape[0]
    if x <= values[0]:
        return 0
    if x >= values[n - 1]:
        return n - 1
    ml = 0
    mu = n - 1
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < values[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - values[mu - 1] < values[mu] - x else mu


@numba.njit(cache=True, nogil=True)
def iq4_block_scales(x, w, values, ntry):
    """quantize_row_iq4_nl_impl's per-block scale search on blocks ``x[g, :]`` (weights ``w``,
    float32 table ``values``); blocks below GROUP_MAX_EPS get 0."""
    groups, n = x.shape
    out = np.zeros(groups, np.float32)
    for g in range(groups):
        amax = _ZERO
        vmax = _ZERO
        for j in range(n):
            ax = abs(x[g, j])
            if ax > amax:
                amax = ax
                vmax = x[g, j]
        if amax < _EPS:
            continue
        d = -vmax / values[0]
        ident = _ONE / d
        sumqx = _ZERO
        sumq2 = _ZERO
        for j in range(n):
            q = values[_best_index(values, ident * x[g, j])]
            sumqx += w[g, j] * q * x[g, j]
            sumq2 += w[g, j] * q * q
        d = sumqx / sumq2 if sumq2 > _ZERO else _ZERO
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            ident = (np.float32(itry) + values[0]) / vmax
            sumqx = _ZERO
            sumq2 = _ZERO
            for j in range(n):
                q = values[_best_index(values, ident * x[g, j])]
                sumqx += w[g, j] * q * x[g, j]
                sumq2 += w[g, j] * q * q
            if sumq2 > _ZERO and sumqx * sumqx > best * sumq2:
                d = sumqx / sumq2
                best = d * sumqx
        out[g] = d
    return out
