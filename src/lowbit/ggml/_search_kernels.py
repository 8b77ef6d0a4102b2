"""Compiled (numba) forms of the hottest searches of lowbit.ggml (K-quants, IQ4), bit for bit.

``qkx_quants`` is ``make_qkx2_quants`` / ``make_qkx3_quants`` and ``qx_quants`` is
``make_qx_quants`` (rmse_type 1): the C loops of ggml-quants.c, one group at a time, every
operation in float32 (constants and integer-to-float conversions made float32 explicitly;
numba does not fuse multiply-adds without ``fastmath``). They take and return the same arrays
as the numpy functions but with one group per *row* (``x.T``: each group's values contiguous);
``iq4_block_scales`` is the per-32 scale search of ``quantize_row_iq4_nl_impl`` (with
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
_TENTH = np.float32(0.1)


_RANGE = np.float32(4194304.0)  # 2**22: within it the sum's mantissa is the rounded integer


@numba.njit(cache=True, inline="always")
def _nearest_int(v: float, scratch: np.ndarray) -> int:
    """ggml's nearest_int: the float32 sum with 1.5 * 2**23, its mantissa bits read back
    (within +-2**22 that is the sum minus 1.5 * 2**23, exactly; beyond, the bits)."""
    if abs(v) < _RANGE:
        return int((v + _MAGIC) - _MAGIC)
    scratch[0] = v + _MAGIC
    bits = scratch.view(np.int32)[0]
    return (bits & 0x007FFFFF) - 0x00400000


@numba.njit(cache=True, nogil=True)
def qkx_quants(x, w, nmax, rmin, rdelta, nstep, use_mad, x3):
    """make_qkx2_quants (x3 False) / make_qkx3_quants (x3 True) on groups ``x[g, :]``."""
    groups, n = x.shape
    scales = np.zeros(groups, np.float32)
    mins = np.zeros(groups, np.float32)
    codes = np.zeros((groups, n), np.int32)
    laux = np.zeros(n, np.int32)
    scratch = np.zeros(1, np.float32)
    fn = np.float32(nmax)
    f_rmin = np.float32(rmin)
    f_rdelta = np.float32(rdelta)
    for g in range(groups):
        lo = x[g, 0]
        hi = x[g, 0]
        sum_w = w[g, 0]
        sum_x = sum_w * x[g, 0]
        for i in range(1, n):
            xi = x[g, i]
            if xi < lo:
                lo = xi
            if xi > hi:
                hi = xi
            sum_w += w[g, i]
            sum_x += w[g, i] * xi
        if lo > _ZERO:
            lo = _ZERO
        if (hi <= lo) if x3 else (hi == lo):
            mins[g] = -lo
            continue
        iscale = fn / (hi - lo)
        scale = _ONE / iscale
        best = _ZERO
        for i in range(n):
            q = _nearest_int(iscale * (x[g, i] - lo), scratch)
            q = max(0, min(nmax, q))
            codes[g, i] = q
            diff = scale * np.float32(q) + lo - x[g, i]
            diff = abs(diff) if use_mad else diff * diff
            best += w[g, i] * diff
        for step in range(nstep + 1):
            iscale = (f_rmin + f_rdelta * np.float32(step) + fn) / (hi - lo)
            sum_l = _ZERO
            sum_l2 = _ZERO
            sum_xl = _ZERO
            for i in range(n):
                q = _nearest_int(iscale * (x[g, i] - lo), scratch)
                q = max(0, min(nmax, q))
                laux[i] = q
                wl = w[g, i] * np.float32(q)
                sum_l += wl
                sum_l2 += wl * np.float32(q)
                sum_xl += wl * x[g, i]
            det = sum_w * sum_l2 - sum_l * sum_l
            if det > _ZERO:
                this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
                this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
                if this_min > _ZERO:
                    this_min = _ZERO
                    this_scale = sum_xl / sum_l2
                cur = _ZERO
                for i in range(n):
                    diff = this_scale * np.float32(laux[i]) + this_min - x[g, i]
                    diff = abs(diff) if use_mad else diff * diff
                    cur += w[g, i] * diff
                if cur < best:
                    for i in range(n):
                        codes[g, i] = laux[i]
                    best = cur
                    scale = this_scale
                    lo = this_min
        scales[g] = scale
        mins[g] = -lo
    return scales, codes, mins


@numba.njit(cache=True, nogil=True)
def qx_quants(x, nmax, qw, has_qw):
    """make_qx_quants(n, nmax, x, L, rmse_type=1, qw or x*x) on groups ``x[g, :]``."""
    groups, n = x.shape
    scales = np.zeros(groups, np.float32)
    codes = np.zeros((groups, n), np.int32)
    scratch = np.zeros(1, np.float32)
    fn = np.float32(nmax)
    for g in range(groups):
        amax = _ZERO
        vmax = _ZERO
        for i in range(n):
            ax = abs(x[g, i])
            if ax > amax:
                amax = ax
                vmax = x[g, i]
        if amax < _EPS:
            continue
        iscale = np.float32(-nmax) / vmax
        sumlx = _ZERO
        suml2 = _ZERO
        for i in range(n):
            q = max(-nmax, min(nmax - 1, _nearest_int(iscale * x[g, i], scratch)))
            codes[g, i] = q + nmax
            wi = qw[g, i] if has_qw else x[g, i] * x[g, i]
            lf = np.float32(q)
            sumlx += wi * x[g, i] * lf
            suml2 += wi * lf * lf
        scale = sumlx / suml2 if suml2 != _ZERO else _ZERO
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(fn + _TENTH * np.float32(step)) / vmax
            sumlx = _ZERO
            suml2 = _ZERO
            for i in range(n):
                q = max(-nmax, min(nmax - 1, _nearest_int(iscale * x[g, i], scratch)))
                wi = qw[g, i] if has_qw else x[g, i] * x[g, i]
                lf = np.float32(q)
                sumlx += wi * x[g, i] * lf
                suml2 += wi * lf * lf
            if suml2 > _ZERO and sumlx * sumlx > best * suml2:
                for i in range(n):
                    q = max(-nmax, min(nmax - 1, _nearest_int(iscale * x[g, i], scratch)))
                    codes[g, i] = q + nmax
                scale = sumlx / suml2
                best = scale * sumlx
        scales[g] = scale
    return scales, codes


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
