"""llama.cpp's lattice i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: super-blocks of 256 to bytes and back.

Each value is ``d * block scale * grid coordinate * sign``: groups of 8 (IQ2) or 4 (IQ3)
values are one point of a lattice grid (:mod:`lowbit.ggml.iq_grids`), signs come in groups of
8 (IQ2_XXS, IQ2_XS, IQ3_XXS: an even number of minus signs, 7 bits stored, the eighth the
parity; IQ2_S, IQ3_S: 8 bits), and each block (32 values; 16 for IQ2_XS and IQ2_S) has a
4-bit scale. The encoders repeat ggml-quants.c's ``quantize_row_iq2_xxs_impl``,
``quantize_row_iq2_xs_impl``, ``quantize_row_iq2_s_impl``, ``quantize_row_iq3_xxs_impl`` and
``quantize_row_iq3_s_impl`` (what ``ggml_quantize_chunk`` calls), vectorised over blocks (a
numba kernel does the tries block by block, :mod:`lowbit.ggml._iq_kernels`), in the C code's
float32 order:

- weights: with an importance vector ``qw * sqrtf(sigma2 + x*x)``, ``sigma2`` the in-order
  sum of the super-block's ``x*x`` over 256 (IQ2_S and IQ3: twice that); without one (IQ2_S,
  IQ3_XXS, IQ3_S; the others need one) ``x*x``, for IQ2_S ``0.25f*sigma2 + x*x``. The
  neighbour search weighs with ``sqrtf(weight)``.
- signs: ``|x|``; with parity, where a group of 8 has an odd number of negatives the value
  with the smallest ``(weight*x)*x`` (the first on ties) keeps its minus sign (its ``|x|``
  negated).
- the scale search: IQ2_XXS starts from ``make_qp_quants(32, 4, |x|, weight)``'s scale
  ``s0`` and tries ``id = (5 + is*0.1f) / (3*s0)`` for ``is`` in -6..6; IQ2_XS and IQ2_S try
  ``(5 + is*0.1f) / max`` for -9..9, IQ3_XXS ``(15 + is*0.2f) / max`` for -15..15 and IQ3_S
  for -9..9 (``max`` the largest signed ``|x|``; a block below ``GROUP_MAX_EPS`` (1e-15;
  1e-8 for IQ3_XXS and IQ2_S; IQ3_S: exactly 0) is zero and writes nothing). Each try rounds
  ``nearest_int(0.5f*(id*x - 1))`` clamped to the levels; a point off the grid goes to its
  listed neighbour with the smallest ``sum((w*diff)*diff)``, ``diff = (1/id)*(2l+1) - x``
  (the first in list order on ties); the try is kept when ``sumqx*sumqx > best*sumq2``
  (``sumqx = sum((w*x)*q)``, ``sumq2 = sum((w*q)*q)``, ``q = 2l+1``, in order), and then
  ``scale = sumqx/sumq2``, ``best = scale*sumqx``.
- the final pass: with ``id = 1/scale`` the points are rounded again and the scale refitted
  ``sumqx/sumq2``: IQ2_XXS every group; IQ2_XS, IQ2_S and IQ3_XXS the groups the kept try had
  off the grid (if any); IQ3_S every group when any was off the grid or no try was kept (its
  "on the grid" flags start false). A negative scale flips it and the signs.
- the super-block: ``d = max_scale/31``, stored as float16 ``d * fudge`` (IQ3_XXS 1.0125f,
  IQ3_S 1.033f, IQ2_S 0.9875f), each block's 4-bit scale ``nearest_int(0.5f*((1/d)*scale -
  1))`` clamped to 0..15, computed with the unfudged float32 ``d``. A super-block whose scales
  are all 0 stores ``d = 0`` and, for IQ2_XXS/XS and IQ3_XXS, zero codes (IQ2_S and IQ3_S keep
  the codes written).

Decoding is gguf-py's (and ggml's): ``db = d*(0.5f + s)*0.25f`` (IQ3_XXS ``*0.5f``; IQ3_S
``d*(1 + 2*s)``), value ``(db*grid)*sign`` with the decoder's grid (8, 25, 43 / 4, 12, ... 62
/ 1, 3, ... 15). Layouts (ggml-common.h), little-endian:

- IQ2_XXS, 66 bytes: float16 ``d``, per block of 32 two uint32: four grid indices (bytes), then
  four 7-bit sign groups (bits ``7k``) and the 4-bit scale (bits 28..31).
- IQ2_XS, 74 bytes: float16 ``d``, 32 uint16 (9-bit grid index | 7 sign bits << 9, per group
  of 8), ``scales[8]`` (block of 16 ``2i`` low nibble, ``2i+1`` high).
- IQ2_S, 82 bytes: float16 ``d``, ``qs[32]`` (low 8 bits of each group's 10-bit index),
  ``signs[32]``, ``qh[8]`` (bits ``2k..2k+1`` of byte ``i``: group ``4i+k``'s high bits),
  ``scales[8]`` as IQ2_XS.
- IQ3_XXS, 98 bytes: float16 ``d``, 64 grid indices (one byte per group of 4), then per block of
  32 one uint32: four 7-bit sign groups and the scale (bits 28..31).
- IQ3_S, 110 bytes: float16 ``d``, ``qs[64]`` (low 8 bits of each 9-bit index), ``qh[8]`` (bit
  ``k`` of byte ``i``: group ``8i+k``'s ninth bit), ``signs[32]``, ``scales[4]`` (blocks
  ``2i``, ``2i+1`` in the nibbles). An all-zero block of 32 writes nothing and llama.cpp does
  not advance its ``qs``/``signs`` pointers past it: the later blocks' bytes move up (kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from lowbit.codecs import _numba
from lowbit.ggml._search import (
    F32,
    f16_bytes,
    make_qp_quants,
    nearest_int,
    read_f16,
    seqsum,
)
from lowbit.ggml.iq_grids import Lattice, decode_grid, lattice

QK_K = 256
_FINAL = {"all": 0, "offgrid": 1, "all_if_any": 2}
_SNAP_BATCH = 1 << 14  # off-grid groups per neighbour search (about 2 M candidates at most)


#: Values the i-quant searches send down the numpy path before buying the numba kernels (the
#: ski rental of ``lowbit.codecs._numba`` at this package's price): their numpy path costs
#: about 2-20 us a value (the neighbour searches, ragged), 5-20x the kernels, so numba's
#: start (about 0.6 s of CPU, and loading the kernels) is paid back within tens of thousands.
IQ_KERNEL_WORTH = 1 << 16

_rental = _numba._Rental(IQ_KERNEL_WORTH, _numba.numba_loaded)


def use_kernels(n: int) -> bool:
    """Whether an i-quant search over ``n`` values runs compiled (numba in use, and
    ``kernels_always()`` or this module's rental says so). Both paths give the same bytes."""
    if not _numba.enabled():
        return False
    if _numba._kernels_always.on or _rental.take(n):
        _numba.taken()
        return True
    return False


@cache
def _kernels() -> Any:
    """``lowbit.ggml._iq_kernels`` (numba, bit for bit the numpy searches), on first use."""
    from lowbit.ggml import _iq_kernels  # needs numba, the optional extra

    return _iq_kernels


BLOCK_BYTES = {"IQ2_XXS": 66, "IQ2_XS": 74, "IQ2_S": 82, "IQ3_XXS": 98, "IQ3_S": 110}


@dataclass(frozen=True)
class _Spec:
    block: int  # values per scaled block
    kmaxq: int  # levels per coordinate
    tries: int  # is in -tries..tries
    step: float  # id = (2*kmaxq - 1 + is*step) / base
    eps: float  # GROUP_MAX_EPS of the type (0: only an all-zero block is zero)
    sigma: float  # sigma2 = sigma * sum(x*x) / 256
    qp_start: bool  # IQ2_XXS: base = make_qp_quants scale * kmaxq
    final: str  # which groups the final pass rounds again: all, offgrid, all_if_any
    parity: bool  # 7 sign bits and an even number of minus signs per 8 (else 8 bits)
    plain: str  # weights without an importance vector: "", "x2" or "sigma" (0.25*sigma2 + x*x)
    fudge: float  # the stored d is float16(d * fudge)
    clear_empty: bool  # a super-block whose scales are all 0 stores zero codes (else as found)


_SPECS = {
    "IQ2_XXS": _Spec(32, 3, 6, 0.1, 1e-15, 1.0, True, "all", True, "", 1.0, True),
    "IQ2_XS": _Spec(16, 3, 9, 0.1, 1e-15, 1.0, False, "offgrid", True, "", 1.0, True),
    "IQ2_S": _Spec(16, 3, 9, 0.1, 1e-8, 2.0, False, "offgrid", False, "sigma", 0.9875, False),
    "IQ3_XXS": _Spec(32, 8, 15, 0.2, 1e-8, 2.0, False, "offgrid", True, "x2", 1.0125, True),
    "IQ3_S": _Spec(32, 8, 9, 0.2, 0.0, 2.0, False, "all_if_any", False, "x2", 1.033, False),
}


def _rowsum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis in float32, element by element from the first (a C ``+=`` loop)."""
    return seqsum(np.moveaxis(a, -1, 0))


def _weights(xs: np.ndarray, qw: np.ndarray | None, sp: _Spec) -> np.ndarray:
    if qw is None and sp.plain == "x2":
        return xs * xs
    s = _rowsum(xs * xs)
    sigma2 = ((F32(sp.sigma) * s if sp.sigma != 1 else s) / F32(QK_K))[:, None]
    if qw is None:
        return F32(0.25) * sigma2 + xs * xs
    return qw * np.sqrt(sigma2 + xs * xs)


def _signs(xb: np.ndarray, w: np.ndarray, parity: bool) -> tuple[np.ndarray, np.ndarray]:
    """(|x| with the parity value negated, sign groups (G, n/8): 7 bits, or 8 without parity)."""
    g, n = xb.shape
    x8 = xb.reshape(g, n // 8, 8)
    neg = x8 < 0
    xval = np.abs(x8)
    if not parity:
        return xval.reshape(g, n), (neg.astype(np.int64) << np.arange(8)).sum(axis=2)
    odd = neg.sum(axis=2) % 2 == 1
    imin = ((w.reshape(g, n // 8, 8) * x8) * x8).argmin(axis=2)  # first minimum, as C's `<`
    gi, ki = np.nonzero(odd)
    xval[gi, ki, imin[gi, ki]] *= F32(-1)
    neg[gi, ki, imin[gi, ki]] ^= True
    bits = (neg.astype(np.int64) << np.arange(8)).sum(axis=2)
    return xval.reshape(g, n), (bits & 127).astype(np.int64)


def _pack_u(lev: np.ndarray, bits: int) -> np.ndarray:
    return (lev.astype(np.int64) << (bits * np.arange(lev.shape[-1]))).sum(axis=-1)


def snap(
    lat: Lattice, lev: np.ndarray, x: np.ndarray, w: np.ndarray, scale: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grid points for levels ``lev`` (N, dims): on the grid as they are, off it the neighbour
    of ``iq2_find_best_neighbour`` / ``iq3_find_best_neighbour`` (smallest
    ``sum((w*(scale*q - x))*(scale*q - x))``, the first listed on ties).

    Returns (grid index (N,), whether it was on the grid (N,), the point's levels (N, dims)).
    """
    u = _pack_u(lev, lat.bits)
    gi = lat.kmap[u].astype(np.int64)
    on = gi >= 0
    offs = np.flatnonzero(~on)
    for a in range(0, offs.size, _SNAP_BATCH):  # batches bound the candidate arrays
        off = offs[a : a + _SNAP_BATCH]
        uo = u[off]
        cnt = lat.nb_count[uo].astype(np.int64)
        seg = np.concatenate([[0], np.cumsum(cnt)[:-1]])
        rep = np.repeat(np.arange(off.size), cnt)
        cand = lat.nb_flat[lat.nb_start[uo][rep] + (np.arange(int(cnt.sum())) - seg[rep])]
        q = lat.pos.T[:, cand]  # (dims, T)
        xo, wo, sr = x[off].T, w[off].T, scale[off][rep]
        d2 = np.zeros(len(cand), dtype=F32)
        for i in range(q.shape[0]):
            diff = sr * q[i] - xo[i][rep]
            d2 += (wo[i][rep] * diff) * diff
        low = np.minimum.reduceat(d2, seg)
        # the first candidate of each list at its minimum (C keeps the first on ties)
        at = np.where(d2 == low[rep], np.arange(len(cand)), len(cand))
        gi[off] = cand[np.minimum.reduceat(at, seg)]
    return gi, on, lat.levels[gi]


def _sums(w: np.ndarray, xval: np.ndarray, lev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = (F32(2) * lev + F32(1)).astype(F32)
    return _rowsum((w * xval) * q), _rowsum((w * q) * q)


def _trials(sp: _Spec, lat: Lattice, xval, w, waux, base, scale, zero) -> tuple:
    """The tries and the final pass, vectorised over blocks: (scale (G,), levels (G, n))."""
    dims = lat.levels.shape[1]
    g, n = xval.shape
    ng = n // dims
    best = np.zeros(g, dtype=F32)
    lev = np.zeros((g, n), dtype=np.int64)
    ongrid = np.full((g, ng), sp.final != "all_if_any")
    xg, wg = xval.reshape(-1, dims), waux.reshape(-1, dims)
    for it in range(-sp.tries, sp.tries + 1):
        ident = (F32(2 * sp.kmaxq - 1) + F32(it) * F32(sp.step)) / base
        this = F32(1) / ident
        laux = np.clip(nearest_int(F32(0.5) * (ident[:, None] * xval - F32(1))), 0, sp.kmaxq - 1)
        _, on, la = snap(lat, laux.reshape(-1, dims), xg, wg, np.repeat(this, ng))
        la = la.reshape(g, n)
        sumqx, sumq2 = _sums(w, xval, la)
        take = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        scale = np.where(take, sumqx / sumq2, scale).astype(F32)
        best = np.where(take, scale * sumqx, best).astype(F32)
        lev = np.where(take[:, None], la, lev)
        ongrid = np.where(take[:, None], on.reshape(g, ng), ongrid)
    redo_grp = ~ongrid
    redo = redo_grp.any(axis=1) & (scale > 0) & ~zero
    if sp.final != "offgrid":
        redo_grp = np.ones((g, ng), dtype=bool)
        if sp.final == "all":
            redo = (scale > 0) & ~zero
    redo_grp &= redo[:, None]
    if redo.any():
        ident = F32(1) / scale
        l2 = np.clip(nearest_int(F32(0.5) * (ident[:, None] * xval - F32(1))), 0, sp.kmaxq - 1)
        sel = np.flatnonzero(redo_grp.reshape(-1))
        _, _, ls = snap(lat, l2.reshape(-1, dims)[sel], xg[sel], wg[sel], np.repeat(scale, ng)[sel])
        lg = lev.reshape(-1, dims)
        lg[sel] = ls
        lev = lg.reshape(g, n)
        sumqx, sumq2 = _sums(w, xval, lev)
        scale = np.where(redo & (sumq2 > 0), sumqx / sumq2, scale).astype(F32)
    return scale, lev


def _search(name: str, xb: np.ndarray, w: np.ndarray) -> tuple:
    """The per-block search on blocks ``xb`` (G, n): (scale, levels (G, n), signs, zero)."""
    sp = _SPECS[name]
    lat = lattice(name)
    dims = lat.levels.shape[1]
    waux = np.sqrt(w)
    xval, signs = _signs(xb, w, sp.parity)
    vmax = xval.max(axis=1)
    zero = (vmax < F32(sp.eps)) | (vmax == 0)
    if sp.qp_start:
        s0 = make_qp_quants(np.ascontiguousarray(xval.T), sp.kmaxq + 1, np.ascontiguousarray(w.T))[
            0
        ]
        base = s0 * F32(sp.kmaxq)
        zero |= base <= 0
        scale = s0
        base = np.where(zero, F32(1), base).astype(F32)  # (zero blocks: any finite search)
    else:
        scale = vmax / F32(2 * sp.kmaxq - 1)
        base = np.where(zero, F32(1), vmax).astype(F32)
    if use_kernels(xb.size):
        scale, lev = _kernels().lattice_trials(
            xval, w, waux, base, scale, zero, sp.kmaxq, sp.tries, F32(sp.step),
            _FINAL[sp.final], sp.final != "all_if_any", dims, lat.bits, lat.kmap,
            lat.nb_start, lat.nb_count, lat.nb_flat, lat.pos, lat.levels,
        )  # fmt: skip
    else:
        scale, lev = _trials(sp, lat, xval, w, waux, base, scale, zero)
    flip = scale < 0
    scale = np.where(flip, -scale, scale).astype(F32)
    signs = np.where(flip[:, None], ~signs & (127 if sp.parity else 255), signs)
    scale = np.where(zero, F32(0), scale).astype(F32)
    return scale, lev, signs, zero


def _super(name: str, xs: np.ndarray, qw: np.ndarray | None) -> tuple:
    """Search every block of the super-blocks ``xs`` (B, 256): (d float32 (B,), block scales
    (B, nb) 0..15, grid indices (B, groups), signs (B, 32) 7-bit, all-zero super-blocks)."""
    sp = _SPECS[name]
    lat = lattice(name)
    nb = xs.shape[0]
    with np.errstate(all="ignore"):  # blocks that are zero (or weigh nothing) divide by zero
        w = _weights(xs, qw, sp)
        scale, lev, signs, zero = _search(name, xs.reshape(-1, sp.block), w.reshape(-1, sp.block))
    gi = lat.kmap[_pack_u(lev.reshape(-1, lat.levels.shape[1]), lat.bits)].astype(np.int64)
    gi = gi.reshape(nb * QK_K // sp.block, -1)
    gi[zero] = 0
    signs[zero] = 0
    scales = scale.reshape(nb, -1)
    max_scale = scales.max(axis=1)
    d = (max_scale / F32(31)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ident = F32(1) / d
        ls = np.clip(nearest_int(F32(0.5) * (ident[:, None] * scales - F32(1))), 0, 15)
    empty = max_scale == 0
    ls[empty] = 0
    gi = gi.reshape(nb, -1)
    signs = signs.reshape(nb, -1)
    if sp.clear_empty:
        gi[empty] = 0
        signs[empty] = 0
    d = np.where(empty, F32(0), d).astype(F32)
    dh = (d * F32(sp.fudge)).astype(F32) if sp.fudge != 1 else d
    return dh, ls, gi, signs, zero.reshape(nb, -1)


def _pack_iq2_xxs(d, ls, gi, signs, zero) -> np.ndarray:
    nb = gi.shape[0]
    w0 = (gi.reshape(nb, 8, 4) << (8 * np.arange(4))).sum(axis=2)
    w1 = (signs.reshape(nb, 8, 4) << (7 * np.arange(4))).sum(axis=2) | (ls << 28)
    words = np.stack([w0, w1], axis=2).astype("<u4").reshape(nb, 16)
    return np.concatenate([f16_bytes(d), words.view(np.uint8)], axis=1)


def _pack_iq2_xs(d, ls, gi, signs, zero) -> np.ndarray:
    q = (gi | (signs << 9)).astype("<u2")
    sc = (ls[:, 0::2] | (ls[:, 1::2] << 4)).astype(np.uint8)
    return np.concatenate([f16_bytes(d), q.view(np.uint8), sc], axis=1)


def _pack_iq3_xxs(d, ls, gi, signs, zero) -> np.ndarray:
    nb = gi.shape[0]
    ss = (signs.reshape(nb, 8, 4) << (7 * np.arange(4))).sum(axis=2) | (ls << 28)
    return np.concatenate(
        [f16_bytes(d), gi.astype(np.uint8), ss.astype("<u4").view(np.uint8)], axis=1
    )


def _pack_iq2_s(d, ls, gi, signs, zero) -> np.ndarray:
    nb = gi.shape[0]
    qh = ((gi >> 8).reshape(nb, 8, 4) << (2 * np.arange(4))).sum(axis=2)
    sc = ls[:, 0::2] | (ls[:, 1::2] << 4)
    parts = [gi & 255, signs, qh, sc]
    return np.concatenate([f16_bytes(d), *(p.astype(np.uint8) for p in parts)], axis=1)


def _pack_iq3_s(d, ls, gi, signs, zero) -> np.ndarray:
    nb = gi.shape[0]
    qh = ((gi >> 8).reshape(nb, 8, 8) << np.arange(8)).sum(axis=2)
    qh = np.where(zero, 0, qh)
    keep = ~zero
    qs = np.zeros((nb, 64), dtype=np.int64)
    sg = np.zeros((nb, 32), dtype=np.int64)
    if keep.all():
        qs, sg = gi & 255, signs
    else:
        for r in range(nb):
            k = np.flatnonzero(keep[r])
            qs[r, : 8 * len(k)] = (gi[r].reshape(8, 8)[k] & 255).reshape(-1)
            sg[r, : 4 * len(k)] = signs[r].reshape(8, 4)[k].reshape(-1)
    sc = ls[:, 0::2] | (ls[:, 1::2] << 4)
    parts = [qs, qh, sg, sc]
    return np.concatenate([f16_bytes(d), *(p.astype(np.uint8) for p in parts)], axis=1)


_PACK = {
    "IQ2_XXS": _pack_iq2_xxs,
    "IQ2_XS": _pack_iq2_xs,
    "IQ2_S": _pack_iq2_s,
    "IQ3_XXS": _pack_iq3_xxs,
    "IQ3_S": _pack_iq3_s,
}


def fit_lattice(name: str, xs: np.ndarray, qw: np.ndarray | None) -> dict[str, np.ndarray]:
    """llama.cpp's scale search alone on super-blocks ``xs`` (B, 256), for GPTQ: the stored
    ``d`` (float32, before its float16 rounding), the 4-bit block scales ``ls`` (B, nb), the
    search's grid indices and signs (as :func:`quantize_iq2_xxs` ... write them), and the
    all-zero blocks (B, nb)."""
    d, ls, gi, signs, zero = _super(name, xs, qw)
    return {"d": d, "ls": ls, "gi": gi, "signs": signs, "zero": zero}


def pack_lattice(name: str, fit: dict[str, np.ndarray], gi: np.ndarray, signs: np.ndarray):
    """The block bytes of ``fit``'s scales with grid indices ``gi`` (B, 256/dims) and sign
    groups ``signs`` (B, 32: 7 bits with parity, else 8). IQ3_S writes every block in place
    (no block is skipped as all-zero: the codes given are the ones decoded)."""
    zero = np.zeros_like(fit["zero"]) if name == "IQ3_S" else fit["zero"]
    return _PACK[name](fit["d"], fit["ls"], gi, signs, zero)


def quantize_iq2_xxs(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` and importance weights ``(B, 256)`` -> IQ2_XXS bytes ``(B, 66)``."""
    return _pack_iq2_xxs(*_super("IQ2_XXS", xs, qw))


def quantize_iq2_xs(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` and importance weights -> IQ2_XS bytes ``(B, 74)``."""
    return _pack_iq2_xs(*_super("IQ2_XS", xs, qw))


def quantize_iq3_xxs(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` (and optional importance weights) -> IQ3_XXS bytes ``(B, 98)``."""
    return _pack_iq3_xxs(*_super("IQ3_XXS", xs, qw))


def quantize_iq2_s(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` (and optional importance weights) -> IQ2_S bytes ``(B, 82)``."""
    return _pack_iq2_s(*_super("IQ2_S", xs, qw))


def quantize_iq3_s(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` (and optional importance weights) -> IQ3_S bytes ``(B, 110)``.

    A block of 32 that is all zero writes no codes, and the C loop does not advance its ``qs``
    and ``signs`` pointers past it: the later blocks' grid bytes and signs move up (``qh`` is
    indexed by block and does not). Kept, since the bytes are llama.cpp's."""
    return _pack_iq3_s(*_super("IQ3_S", xs, qw))


_KSIGN_BITS = np.arange(8)


def _sign_values(s7: np.ndarray) -> np.ndarray:
    """7-bit sign groups -> (..., 8) float32 +-1 (the eighth sign makes the parity even)."""
    s7 = s7.astype(np.int64)
    par = np.zeros_like(s7)
    for i in range(7):
        par ^= (s7 >> i) & 1
    s8 = s7 | (par << 7)
    neg = (s8[..., None] >> _KSIGN_BITS) & 1
    return np.where(neg == 1, F32(-1), F32(1))


def dequantize_iq2_xxs(b: np.ndarray) -> np.ndarray:
    """IQ2_XXS bytes ``(B, 66)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    d = read_f16(b, 0)
    qs = np.ascontiguousarray(b[:, 2:]).view("<u4").reshape(nb, 8, 2).astype(np.int64)
    db = (d[:, None] * (F32(0.5) + (qs[..., 1] >> 28).astype(F32))) * F32(0.25)
    idx = (qs[..., 0:1] >> (8 * np.arange(4))) & 255
    grid = decode_grid("IQ2_XXS")[idx]  # (nb, 8, 4, 8)
    signs = _sign_values((qs[..., 1:2] >> (7 * np.arange(4))) & 127)
    return ((db[..., None, None] * grid) * signs).reshape(nb, QK_K)


def dequantize_iq2_xs(b: np.ndarray) -> np.ndarray:
    """IQ2_XS bytes ``(B, 74)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    d = read_f16(b, 0)
    qs = np.ascontiguousarray(b[:, 2:66]).view("<u2").reshape(nb, 16, 2).astype(np.int64)
    sc = b[:, 66:74].astype(np.int64)
    s16 = np.stack([sc & 15, sc >> 4], axis=2).reshape(nb, 16)
    db = (d[:, None] * (F32(0.5) + s16.astype(F32))) * F32(0.25)
    grid = decode_grid("IQ2_XS")[qs & 511]  # (nb, 16, 2, 8)
    signs = _sign_values(qs >> 9)
    return ((db[..., None, None] * grid) * signs).reshape(nb, QK_K)


def dequantize_iq2_s(b: np.ndarray) -> np.ndarray:
    """IQ2_S bytes ``(B, 82)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    d = read_f16(b, 0)
    qh = b[:, 66:74].astype(np.int64)
    hi = ((qh[..., None] >> (2 * np.arange(4))) & 3).reshape(nb, 32)
    gi = b[:, 2:34].astype(np.int64) | (hi << 8)
    sc = b[:, 74:82].astype(np.int64)
    s16 = np.stack([sc & 15, sc >> 4], axis=2).reshape(nb, 16)
    db = (d[:, None] * (F32(0.5) + s16.astype(F32))) * F32(0.25)
    grid = decode_grid("IQ2_S")[gi].reshape(nb, 16, 2, 8)
    neg = (b[:, 34:66].astype(np.int64)[..., None] >> np.arange(8)) & 1
    signs = np.where(neg == 1, F32(-1), F32(1)).reshape(nb, 16, 2, 8)
    return ((db[..., None, None] * grid) * signs).reshape(nb, QK_K)


def dequantize_iq3_s(b: np.ndarray) -> np.ndarray:
    """IQ3_S bytes ``(B, 110)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    d = read_f16(b, 0)
    qh = b[:, 66:74].astype(np.int64)
    hi = ((qh[..., None] >> np.arange(8)) & 1).reshape(nb, 64)
    gi = b[:, 2:66].astype(np.int64) | (hi << 8)
    sc = b[:, 106:110].astype(np.int64)
    s8 = np.stack([sc & 15, sc >> 4], axis=2).reshape(nb, 8)
    db = d[:, None] * (1 + 2 * s8).astype(F32)
    grid = decode_grid("IQ3_S")[gi].reshape(nb, 8, 4, 8)
    neg = (b[:, 74:106].astype(np.int64)[..., None] >> np.arange(8)) & 1
    signs = np.where(neg == 1, F32(-1), F32(1)).reshape(nb, 8, 4, 8)
    return ((db[..., None, None] * grid) * signs).reshape(nb, QK_K)


def dequantize_iq3_xxs(b: np.ndarray) -> np.ndarray:
    """IQ3_XXS bytes ``(B, 98)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    d = read_f16(b, 0)
    gi = b[:, 2:66].astype(np.int64).reshape(nb, 8, 4, 2)
    ss = np.ascontiguousarray(b[:, 66:98]).view("<u4").astype(np.int64).reshape(nb, 8)
    db = (d[:, None] * (F32(0.5) + (ss >> 28).astype(F32))) * F32(0.5)
    grid = decode_grid("IQ3_XXS")[gi].reshape(nb, 8, 4, 8)
    signs = _sign_values((ss[..., None] >> (7 * np.arange(4))) & 127)
    return ((db[..., None, None] * grid) * signs).reshape(nb, QK_K)
