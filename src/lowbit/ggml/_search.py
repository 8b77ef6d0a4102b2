"""The scale searches llama.cpp's quantizers share (ggml-quants.c), vectorised over groups.

Every function here takes groups *column-wise*: an array of shape ``(n, G)`` holds ``G`` groups
of ``n`` values, one group per column, so that one numpy operation does one step of the C loop
for all groups at once. The C code's float32 arithmetic is kept operation for operation and in
the same order: products as ``(a*b)*c`` where C writes ``a*b*c``, sums accumulated element by
element from the first (:func:`seqsum`, never numpy's pairwise summation), divisions where C
divides. The integer tricks are copied too: ``nearest_int`` adds ``1.5 * 2**23`` and reads the
mantissa bits (round half to even, garbage beyond 2**22 exactly as in C), and stores into
``uint8``/``int8`` wrap modulo 256 where C's do. llama.cpp compiles its quantizers into
``ggml-base`` without ``-march=native``, so x86-64 builds do not fuse multiply-adds and these
functions give the same bits (ARM builds may differ).

Searches whose C loop stops early when nothing changes (``make_q3_quants``, ``make_qp_quants``)
run all their rounds here: a round that changes nothing leaves the state as it was, so the
extra rounds are no-ops.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from lowbit.codecs import _numba

F32 = np.float32
GROUP_MAX_EPS = F32(1e-15)
"""``GROUP_MAX_EPS``: groups whose largest magnitude is below this quantize to zero."""

_MAGIC = F32(12582912.0)  # 1.5 * 2**23


#: Values the K-quant searches send down the numpy path before the numba kernels are worth
#: loading (the ski rental of ``lowbit.codecs._numba``, with this package's own price): the
#: searches cost about 150 ns a value more in numpy (Q4_K on one core, 1536 x 1536: 4.1
#: against 9.4 million values a second), so numba's start (about 0.6 s of CPU) is paid back
#: after about 4 million values, where the codecs' element-wise work needs 64 million.
KERNEL_WORTH = 1 << 22

_rental = _numba._Rental(KERNEL_WORTH, _numba.numba_loaded)


def _use_kernels(n: int) -> bool:
    """Whether a search over ``n`` values runs compiled: numba in use (``_numba.enabled``), and
    ``kernels_always()`` or this package's rental says so. Both paths give the same bits."""
    if not _numba.enabled():
        return False
    if _numba._kernels_always.on or (n >= _numba.MIN_KERNEL_SIZE and _rental.take(n)):
        _numba.taken()
        return True
    return False


@cache
def _k() -> Any:
    """``lowbit.ggml._search_kernels`` (compiled, bit for bit the numpy functions), on first use."""
    from lowbit.ggml import _search_kernels as _kernels  # needs numba, the optional extra

    return _kernels


def f32(v: object) -> np.ndarray:
    """``v`` as a float32 array (no copy when it already is one)."""
    return np.asarray(v, dtype=F32)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: round float32 to the nearest integer, ties to even (int32).

    The same bit trick as C: beyond +-2**22 (where C asserts, compiled out in release builds)
    the result is the same garbage as C's.
    """
    bits = (f32(v) + _MAGIC).view(np.int32)
    return (bits & np.int32(0x007FFFFF)) - np.int32(0x00400000)


def seqsum(a: np.ndarray) -> np.ndarray:
    """Sum over axis 0 in float32, element by element from the first, as a C ``+=`` loop does."""
    a = np.ascontiguousarray(a, dtype=F32)
    out = a[0].copy()
    for row in a[1:]:
        out += row
    return out


def first_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(largest ``|x|`` of each column, the value with its sign): the first one on ties.

    As C's ``if (ax > amax) { amax = ax; max = x[i]; }`` from ``amax = max = 0``: NaN never
    wins (a column of NaN, from sums that overflowed, gives 0 and 0, as in llama.cpp).
    """
    a = np.abs(x)
    a = np.where(a == a, a, F32(0))
    idx = a.argmax(axis=0)
    cols = np.arange(x.shape[1])
    amax = a[idx, cols]
    return amax, np.where(amax > 0, x[idx, cols], F32(0)).astype(x.dtype)


def to_f16(v: np.ndarray) -> np.ndarray:
    """``GGML_FP32_TO_FP16`` then back to float32: round to nearest even, overflow to inf."""
    with np.errstate(over="ignore"):
        return f32(v).astype(np.float16).astype(F32)


def f16_bytes(v: np.ndarray) -> np.ndarray:
    """Float32 values as little-endian float16 bytes, shape ``(*v.shape, 2)``."""
    with np.errstate(over="ignore"):
        h = f32(v).astype(np.float16)
    return np.ascontiguousarray(h).view(np.uint8).reshape(*h.shape, 2)


def read_f16(b: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian float16 at byte ``offset`` of each block (row) of ``b``, as float32 (B,)."""
    return np.ascontiguousarray(b[:, offset : offset + 2]).view(np.float16)[:, 0].astype(F32)


def _clip(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.minimum(np.maximum(v, lo), hi)


def make_qx_quants(
    x: np.ndarray, nmax: int, qw: np.ndarray | None = None, *, rule: bool = False
) -> Any:
    """``make_qx_quants(n, nmax, x, L, rmse_type=1, qw)``: symmetric codes with a scale search.

    Returns ``(scale (G,), L (n, G) int32 in 0..2*nmax-1)``; weights ``qw`` or ``x*x``. With
    ``rule`` (numpy only) also the inverse scale the codes were rounded with, ``(G,)``: ``L``
    is ``clamp(nearest_int(iscale * x), -nmax, nmax-1) + nmax`` (0 in groups whose scale is 0).
    """
    if not rule and _use_kernels(x.size):
        xc = np.ascontiguousarray(x, dtype=F32)
        qc = xc if qw is None else np.ascontiguousarray(qw, dtype=F32)
        return _k().qx_quants(xc, nmax, qc, qw is not None)
    amax, vmax = first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    w = qw if qw is not None else x * x
    fn = F32(nmax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-nmax) / vmax
        lcode = _clip(nearest_int(iscale * x), -nmax, nmax - 1)
        lf = lcode.astype(F32)
        sumlx = seqsum(w * x * lf)
        suml2 = seqsum(w * lf * lf)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
        best = scale * sumlx
        codes = lcode + nmax
        used = iscale
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(fn + F32(0.1) * F32(step)) / vmax
            lcode = _clip(nearest_int(iscale * x), -nmax, nmax - 1)
            lf = lcode.astype(F32)
            sumlx = seqsum(w * x * lf)
            suml2 = seqsum(w * lf * lf)
            take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            codes = np.where(take, lcode + nmax, codes)
            used = np.where(take, iscale, used).astype(F32)
            scale = np.where(take, sumlx / suml2, scale).astype(F32)
            best = np.where(take, scale * sumlx, best).astype(F32)
    out = np.where(zero, F32(0), scale).astype(F32), np.where(zero, 0, codes)
    return (*out, np.where(zero, F32(0), used).astype(F32)) if rule else out


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_q3_quants(n, nmax, x, L, do_rmse=true)``: Q3_K's per-16 scale without weights.

    Returns ``(scale (G,), L (n, G) int32 in 0..2*nmax-1)``.
    """
    if _use_kernels(x.size):
        return _k().q3_quants(np.ascontiguousarray(x, dtype=F32), nmax)
    amax, vmax = first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    wx = w * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-nmax) / vmax
        lcode = _clip(nearest_int(iscale * x), -nmax, nmax - 1)
        lf = lcode.astype(F32)
        sumlx = seqsum(wx * lf)
        suml2 = seqsum(w * lf * lf)
        for _ in range(5):
            changed = False
            for i in range(x.shape[0]):
                li = lcode[i].astype(F32)
                slx = sumlx - wx[i] * li
                sl2 = suml2 - w[i] * li * li
                new = _clip(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1)
                nf = new.astype(F32)
                slx2 = slx + wx[i] * nf
                sl22 = sl2 + w[i] * nf * nf
                take = (
                    (slx > 0)
                    & (new != lcode[i])
                    & (sl22 > 0)
                    & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                )
                if take.any():
                    changed = True
                    lcode[i] = np.where(take, new, lcode[i])
                    sumlx = np.where(take, slx2, sumlx).astype(F32)
                    suml2 = np.where(take, sl22, suml2).astype(F32)
            if not changed:
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero, 0, lcode + nmax)


def make_qkx_quants(
    x: np.ndarray,
    weights: np.ndarray,
    nmax: int,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool,
    x3: bool,
    *,
    rule: bool = False,
) -> Any:
    """``make_qkx2_quants`` (``x3=False``) / ``make_qkx3_quants`` (``x3=True``): affine codes.

    Returns ``(scale (G,), L (n, G) int32 in 0..nmax, the_min (G,))`` where a value is
    ``scale * L - the_min``. With ``rule`` (numpy only) also the inverse scale and offset the
    codes were rounded with, ``(G,)`` each: ``L`` is ``clamp(nearest_int(iscale * (x - lo)),
    0, nmax)`` (0 in flat groups, whose scale is 0).
    """
    if not rule and _use_kernels(x.size):
        xc = np.ascontiguousarray(x, dtype=F32)
        wc = np.ascontiguousarray(weights, dtype=F32)
        return _k().qkx_quants(xc, wc, nmax, rmin, rdelta, nstep, use_mad, x3)
    lo = x.min(axis=0)
    hi = x.max(axis=0)
    sum_w = seqsum(weights)
    sum_x = seqsum(weights * x)
    lo = np.where(lo > 0, F32(0), lo).astype(F32)
    flat = (hi <= lo) if x3 else (hi == lo)
    fn = F32(nmax)

    def err(diff: np.ndarray) -> np.ndarray:
        return seqsum(weights * (np.abs(diff) if use_mad else diff * diff))

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = fn / (hi - lo)
        scale = F32(1) / iscale
        codes = _clip(nearest_int(iscale * (x - lo)), 0, nmax)
        best = err(scale * codes.astype(F32) + lo - x)
        used_is, used_lo = iscale, lo
        for step in range(nstep + 1):
            iscale = (F32(rmin) + F32(rdelta) * F32(step) + fn) / (hi - lo)
            lcode = _clip(nearest_int(iscale * (x - lo)), 0, nmax)
            lf = lcode.astype(F32)
            wl = weights * lf
            sum_l = seqsum(wl)
            sum_l2 = seqsum(wl * lf)
            sum_xl = seqsum(wl * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            pos = this_min > 0
            this_min = np.where(pos, F32(0), this_min).astype(F32)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale).astype(F32)
            cur = err(this_scale * lf + this_min - x)
            take = (det > 0) & (cur < best) & ~flat
            used_is = np.where(take, iscale, used_is).astype(F32)
            used_lo = np.where(take, lo, used_lo).astype(F32)
            codes = np.where(take, lcode, codes)
            best = np.where(take, cur, best).astype(F32)
            scale = np.where(take, this_scale, scale).astype(F32)
            lo = np.where(take, this_min, lo).astype(F32)
    scale = np.where(flat, F32(0), scale).astype(F32)
    codes = np.where(flat, 0, codes)
    if rule:
        return scale, codes, (-lo).astype(F32), np.where(flat, F32(0), used_is), used_lo
    return scale, codes, (-lo).astype(F32)


def make_qp_quants(x: np.ndarray, nmax: int, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``make_qp_quants(n, nmax, x, L, quant_weights)``: non-negative codes for scales.

    Returns ``(scale (G,), L (n, G) int32)``: ``L`` as the C code's ``uint8_t`` holds it.
    """
    vmax = np.maximum(x.max(axis=0), F32(0))
    zero = vmax < GROUP_MAX_EPS
    fn = F32(nmax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = fn / vmax
        first = nearest_int(iscale * x) & 0xFF
        scale = F32(1) / iscale
        diff = x - scale * first.astype(F32)
        best = seqsum(qw * diff * diff)
        for step in range(-4, 5):
            if step == 0:
                continue
            iscale_is = (F32(0.1) * F32(step) + fn) / vmax
            scale_is = F32(1) / iscale_is
            lcode = np.minimum(nmax, nearest_int(iscale_is * x))
            diff = x - scale_is * lcode.astype(F32)
            mse = seqsum(qw * diff * diff)
            take = mse < best
            best = np.where(take, mse, best).astype(F32)
            iscale = np.where(take, iscale_is, iscale).astype(F32)
        lint = np.minimum(nmax, nearest_int(iscale * x))
        lf = lint.astype(F32)
        sumlx = seqsum(qw * x * lf)
        suml2 = seqsum(qw * lf * lf)
        stored = lint & 0xFF
        for _ in range(5):
            changed = False
            for i in range(x.shape[0]):
                w = qw[i]
                li = stored[i].astype(F32)
                slx = sumlx - w * x[i] * li
                sl2 = suml2 - w * li * li
                new = np.minimum(nmax, nearest_int(x[i] * sl2 / slx))
                nf = new.astype(F32)
                slx2 = slx + w * x[i] * nf
                sl22 = sl2 + w * nf * nf
                take = (
                    (slx > 0)
                    & (sl2 > 0)
                    & (new != stored[i])
                    & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                )
                if take.any():
                    changed = True
                    stored[i] = np.where(take, new & 0xFF, stored[i])
                    sumlx = np.where(take, slx2, sumlx).astype(F32)
                    suml2 = np.where(take, sl22, suml2).astype(F32)
            if not changed:
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero, 0, stored)


def best_index_int8(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``best_index_int8(n, values, x)``: index of the sorted table entry nearest ``x``.

    Ties between two entries go to the upper one; the comparison is ggml's, in float32:
    ``x - values[mu-1] < values[mu] - x`` (NaN gives the last index, as the C search does).
    """
    v = np.asarray(values)
    vf = v.astype(F32)
    xf = f32(x)
    n = len(v)
    # mu, the first entry above x, from a table: for integer entries "v <= x" is
    # "v <= floor(x)", so how many entries are at most x depends on floor(x) only
    lo, hi = int(v[0]) - 1, int(v[-1]) + 1
    count = np.clip(np.searchsorted(v, np.arange(lo, hi + 1), side="right"), 1, n - 1)
    fl = np.floor(np.fmax(np.fmin(xf, F32(hi)), F32(lo))).astype(np.intp) - lo
    mu = np.take(count, fl)
    lower = (xf - np.take(vf, mu - 1)) < (np.take(vf, mu) - xf)
    idx = mu - lower
    idx = np.where(xf <= vf[0], 0, idx)
    return np.where(xf >= vf[-1], n - 1, idx)
