"""GPTQ onto llama.cpp's 1-bit i-quants IQ1_S and IQ1_M: a ternary point per group of 8.

A group of 8 weights decodes as ``dl * (grid + delta)``: ``grid`` one of the 2048 points of
``kgrid_1bit_2048`` (levels -1, 0, 1), ``delta`` ``+-IQ1S_DELTA`` (0.125) and ``dl = d*(2*s+1)``
with ``d`` the super-block's float16 and ``s`` a 3-bit block scale (:mod:`lowbit.ggml.iq1`).
IQ1_S has ``s`` and ``delta`` per block of 32 (four groups); IQ1_M ``s`` per block of 16 (two
groups) and ``delta`` per group. The walk of :mod:`lowbit.methods._iq_walk` drives
:class:`IQ1Codec`:

- the scales and shifts: llama.cpp's own search on the super-block
  (:func:`lowbit.ggml.iq1.fit_iq1`: ``d``, the 3-bit scales and every group's shift, with the
  importance matrix, else ``diag(H)``), its scales kept as it chose them (and IQ1_S's shifts,
  one per block of 32).
- the rounding (:func:`round_group_iq1`): each group's grid point chosen among all 2048 on the
  decoded values ``dl*(grid + delta)``: every point scored under ``diag(M)`` (one matrix
  product), then the ``top`` best under the full metric ``M``. IQ1_M stores a shift per group,
  a code like the lattice types' sign bits: there the walk chooses it too (2 x 2048 points;
  on synthetic correlated inputs about 8 % less layer error than keeping llama.cpp's).
- the bytes: the chosen indices packed with llama.cpp's scales and shifts
  (:func:`lowbit.ggml.iq1.pack_iq1`), so ggml and gguf-py decode exactly the values the walk
  used; afterwards each row's ``d`` may be refitted to the codes (a float16 of its own: exact
  to pack).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from lowbit.ggml import iq1
from lowbit.ggml._search import F32, f16_bytes, read_f16
from lowbit.methods._iq_walk import GROUP, QK_K, TOP, best_under, grid

__all__ = ["IQ1_TYPES", "IQ1Codec", "group_scales", "round_group_iq1"]

IQ1_TYPES = ("IQ1_S", "IQ1_M")
"""The 1-bit i-quant types."""

_DELTA = F32(0.125)  # IQ1S_DELTA


def group_scales(name: str, fit: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each group of 8's decoded block scale ``dl`` (B, 32) float32, as the decoders compute it
    (``d`` read back from its float16, times ``2*s+1``), and its shift ``delta`` (B, 32) float32,
    from :func:`lowbit.ggml.iq1.fit_iq1`'s ``fit``."""
    dh = read_f16(f16_bytes(np.asarray(fit["d"], F32)), 0)[:, None]
    dl = (dh * (2 * np.asarray(fit["ls"]) + 1).astype(F32)).astype(F32)
    per = 4 if name == "IQ1_S" else 2  # groups per block scale
    delta = np.where(fit["minus"], -_DELTA, _DELTA).astype(F32)
    return np.repeat(dl, per, axis=1), delta


@cache
def _g64() -> np.ndarray:
    g = grid("IQ1_S").astype(np.float64)
    g.setflags(write=False)
    return g


def _grid_terms(dv: np.ndarray) -> np.ndarray:
    """(11, 2048): each grid point's ``sum dv g^2``, ``sum dv g``, ``-2 g`` and 1."""
    g = _g64()
    ones = np.ones((1, g.shape[0]))
    return np.concatenate([((g * g) @ dv)[None], (g @ dv)[None], -2 * g.T, ones])


def _smallest(cost: np.ndarray, c: int, chunk: int = 32) -> np.ndarray:
    """(R, c) column indices of each row's ``c`` least costs (in no order; on ties any of
    them), as ``argpartition`` gives, faster on long rows: the ``c`` least lie in the ``c``
    chunks of ``chunk`` columns with the least minima, so only those are partitioned."""
    rows, n = cost.shape
    c = min(c, n)
    if n % chunk or n // chunk <= c:
        return np.argpartition(cost, c - 1, axis=1)[:, :c]
    mins = cost.reshape(rows, n // chunk, chunk).min(axis=2)
    ch = np.argpartition(mins, c - 1, axis=1)[:, :c]  # (R, c) chunks
    cols = (ch[:, :, None] * chunk + np.arange(chunk)).reshape(rows, -1)
    sub = np.take_along_axis(cost, cols, axis=1)
    at = np.argpartition(sub, c - 1, axis=1)[:, :c]
    return np.take_along_axis(cols, at, axis=1)


def round_group_iq1(
    dl: np.ndarray,
    delta: np.ndarray,
    w: np.ndarray,
    M: np.ndarray,
    top: int | None = None,
    free_shift: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The grid point (and shift) of one group of 8 columns nearest each row's values.

    Args:
        dl: (R,) float32 decoded block scale of each row at these columns.
        delta: (R,) float32 shift of each row's group (``+-0.125``).
        w: (R, 8) the values (GPTQ's updated weights).
        M: (8, 8) the metric ``e^T M e`` (positive definite; the identity for plain distance).
        top: candidates (by ``diag(M)``) rescored under the full ``M`` (default
            :data:`~lowbit.methods._iq_walk.TOP`); 1: ``diag(M)`` alone.
        free_shift: choose the shift too (2 x 2048 candidates; ``delta`` unused), as IQ1_M
            stores one per group.

    Returns:
        (grid indices (R,) int64, the shifts are ``-delta`` (R,) bool, decoded values
        ``dl*(grid + delta)`` (R, 8) float32).
    """
    top = TOP if top is None else top
    g = grid("IQ1_S")
    P = g.shape[0]
    w = np.asarray(w, np.float64)
    dl64 = dl.astype(np.float64)
    dv = np.diag(M).astype(np.float64)
    gm = _grid_terms(dv)
    wdv = w * dv
    shifts = (np.full_like(delta, _DELTA), np.full_like(delta, -_DELTA)) if free_shift else (delta,)
    cost = []
    for sh in shifts:
        # sum_k dv_k (dl*(g_k + sh) - w_k)^2 over dl (> 0: each row's order kept), less the
        # row's sum_k dv_k w_k^2 / dl: one matrix product over the grid
        s64 = sh.astype(np.float64)
        const = dl64 * s64 * s64 * dv.sum() - 2 * s64 * wdv.sum(axis=1)
        X = np.concatenate([dl64[:, None], (2 * dl64 * s64)[:, None], wdv, const[:, None]], 1)
        cost.append(X @ gm)
    pick = _smallest(np.concatenate(cost, axis=1), top)  # (R, C) of (R, P * shifts)
    gi = pick % P
    sh = np.where(pick >= P, -_DELTA, _DELTA) if free_shift else delta[:, None]
    vals = (dl[:, None, None] * (g[gi] + sh[..., None])).astype(F32)  # (R, C, 8)
    best = best_under(w, vals, M)
    r = np.arange(w.shape[0])
    minus = np.broadcast_to(sh, gi.shape)[r, best] < 0
    return gi[r, best].astype(np.int64), minus, vals[r, best]


class IQ1Codec:
    """IQ1_S's or IQ1_M's codes for :func:`lowbit.methods._iq_walk.walk`: a grid index and a
    shift per group of 8, on llama.cpp's scales (and, unless ``free_shift``, its shifts).

    Args:
        name: ``"IQ1_S"`` or ``"IQ1_M"``.
        free_shift: IQ1_M: GPTQ chooses each group's shift with its grid point (default: the
            shift is a per-group code as the sign bits of the lattice types are; measured
            lower layer error than llama.cpp's shifts). IQ1_S shares its shift over 4 groups
            and always keeps llama.cpp's.
    """

    width = 2

    def __init__(self, name: str, free_shift: bool = True) -> None:
        self.name = name
        self.free_shift = free_shift and name == "IQ1_M"

    def fit(self, xs: np.ndarray, qw: np.ndarray | None) -> dict[str, np.ndarray]:
        return iq1.fit_iq1(self.name, xs, qw)

    def scales(self, fit: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return group_scales(self.name, fit)

    def round(self, db: np.ndarray, aux: np.ndarray, w: np.ndarray, M: np.ndarray) -> tuple:
        gi, minus, q = round_group_iq1(db, aux, w, M, free_shift=self.free_shift)
        return np.stack([gi, minus], axis=1), q

    def pack(self, fits: list, codes: np.ndarray) -> np.ndarray:
        rows, groups, _ = codes.shape
        nsb = groups * GROUP // QK_K
        per = {key: np.stack([f[key] for f in fits], axis=1) for key in ("d", "ls", "empty")}
        fit = {k: v.reshape(rows * nsb, *v.shape[2:]) for k, v in per.items()}
        gi = codes[..., 0].reshape(rows * nsb, QK_K // GROUP)
        # IQ1_S: the 4 groups of a block carry the block's (kept) shift alike
        fit["minus"] = codes[..., 1].reshape(gi.shape).astype(bool) & ~fit["empty"][:, None]
        gi = np.where(fit["empty"][:, None], 0, gi)  # decodes to zero: the codes llama.cpp writes
        return np.ascontiguousarray(iq1.pack_iq1(self.name, fit, gi).reshape(rows, -1))
