"""GPTQ onto llama.cpp's i-quants below 4 bits: the lattice types' codes, and the entry point.

In IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S 8 weights (IQ2) or 4 (IQ3) are one point of a grid
(:mod:`lowbit.ggml.iq_grids`) times a sign per weight, and the signs come in groups of 8, which
for IQ2_XXS, IQ2_XS and IQ3_XXS must hold an even number of minus signs (7 bits stored, the
eighth their parity). A column therefore cannot be rounded alone: GPTQ takes the columns in
groups of 8 (one sign group: one IQ2 point, two IQ3 points), GPTVQ-style, in the walk of
:mod:`lowbit.methods._iq_walk`; IQ1_S and IQ1_M (a ternary point per group of 8, shifted) walk
the same way with the codes of :mod:`lowbit.methods._iq1_gptq`. Here, for the lattice types:

- the scales: each super-block of 256 columns gets llama.cpp's own search
  (:func:`lowbit.ggml.iq_lattice.fit_lattice`: ``d`` and the 4-bit block scales, with the
  importance matrix, else ``diag(H)``, as :class:`~lowbit.methods._ggml_gptq.GgmlTarget`
  resolves it), when the walk reaches it (``act_order="none"``) or up front (``"static"``).
- the rounding (:func:`round_group`): every allowed point (each grid point on the *decoded*
  grid, ``db*grid``, with its best signs: those of the weights, or where parity forbids, one
  flipped at the least cost) is scored under ``diag(M)`` (a matrix product over the whole
  grid), then the ``top`` best are scored again under the group's full metric ``M`` and the
  best is kept.

The chosen grid indices and signs are packed with llama.cpp's scales into the type's block bytes
(:func:`lowbit.ggml.iq_lattice.pack_lattice`), so ggml and gguf-py decode exactly the values the
walk used. With a diagonal Hessian no error moves and every group takes the grid point nearest
the weights under ``diag(H)`` at llama.cpp's scales: at most llama.cpp's weighted error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.ggml import blocks, iq_lattice
from lowbit.ggml._search import F32, f16_bytes, read_f16
from lowbit.methods._iq1_gptq import IQ1_TYPES, IQ1Codec
from lowbit.methods._iq_walk import GROUP, QK_K, TOP, best_under, diag_costs, grid, walk

__all__ = ["IQ_TYPES", "LATTICE_TYPES", "block_scales", "round_group", "solve_lattice"]

LATTICE_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
"""The lattice i-quant types: grid points times signs."""

IQ_TYPES = LATTICE_TYPES + IQ1_TYPES
"""The i-quant types GPTQ rounds onto as vector codes (:func:`solve_lattice`)."""


def _parity(name: str) -> bool:
    return name in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS")


def _block(name: str) -> int:
    return 16 if name in ("IQ2_XS", "IQ2_S") else 32


def block_scales(name: str, d: np.ndarray, ls: np.ndarray) -> np.ndarray:
    """(B, nb) float32 block scales ``db`` as the decoders compute them from ``fit_lattice``'s
    ``d`` (B,) (stored as float16) and 4-bit scales ``ls`` (B, nb)."""
    dh = read_f16(f16_bytes(np.asarray(d, F32)), 0)[:, None]
    s = np.asarray(ls).astype(F32)
    if name == "IQ3_S":
        return (dh * (F32(1) + F32(2) * s)).astype(F32)
    half = F32(0.5) if name == "IQ3_XXS" else F32(0.25)
    return ((dh * (F32(0.5) + s)) * half).astype(F32)


def _flip_cost(g: np.ndarray, a: np.ndarray, db: np.ndarray, dv: np.ndarray) -> tuple:
    """(R, P) least added cost of flipping one sign in this part, and which coordinate."""
    t = 4 * (db[:, None, None] * g.astype(np.float64)[None]) * (a * dv)[:, None, :]
    k = t.argmin(axis=2)
    return np.take_along_axis(t, k[..., None], axis=2)[..., 0], k


def round_group(
    name: str, db: np.ndarray, w: np.ndarray, M: np.ndarray, top: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The allowed point of one group of 8 columns nearest each row's values.

    Args:
        name: a type of :data:`LATTICE_TYPES`.
        db: (R,) float32 block scale of each row at these columns.
        w: (R, 8) the values (GPTQ's updated weights).
        M: (8, 8) the metric ``e^T M e`` (positive definite; the identity for plain distance).
        top: candidates (by ``diag(M)``) rescored under the full ``M`` (default :data:`TOP`);
            1: ``diag(M)`` alone.

    Returns:
        (grid indices (R, 8/dims) int64, sign bits (R,) int64: 7 with parity, else 8, decoded
        values (R, 8) float32).
    """
    top = TOP if top is None else top
    g = grid(name)
    dims = g.shape[1]
    parts = GROUP // dims
    rows = w.shape[0]
    w = np.asarray(w, np.float64)
    a = np.abs(w)
    neg = w < 0
    dv = np.diag(M).astype(np.float64)
    db64 = db.astype(np.float64)
    odd = (neg.sum(axis=1) % 2 == 1) if _parity(name) else np.zeros(rows, bool)
    sl = [slice(h * dims, (h + 1) * dims) for h in range(parts)]
    cost = [diag_costs(g, a[:, s], db64, dv[s]) for s in sl]
    zeros = (np.zeros((rows, g.shape[0])), np.zeros((rows, g.shape[0]), np.int64))
    flip = [_flip_cost(g, a[:, s], db64, dv[s]) if odd.any() else zeros for s in sl]
    P = g.shape[0]
    # candidates: (R, C) point index per part, and which part (-1: none) flips which coordinate
    if parts == 1:
        tot = cost[0] + np.where(odd[:, None], flip[0][0], 0.0)
        c = min(top, P)
        pick = (
            np.argpartition(tot, c - 1, axis=1)[:, :c]
            if c < P
            else np.tile(np.arange(P), (rows, 1))
        )
        pts = pick[:, :, None]
        fpart = np.where(odd[:, None], 0, -1) + np.zeros_like(pick)
        fk = np.take_along_axis(flip[0][1], pick, axis=1)
    else:  # two parts: the flip goes to one of them (or neither)
        c = min(top, P)
        bestp = [np.argpartition(cs, c - 1, axis=1)[:, :c] for cs in cost]
        withf = [
            np.argpartition(cs + f[0], c - 1, axis=1)[:, :c]
            for cs, f in zip(cost, flip, strict=True)
        ]
        one = [cs.argmin(axis=1)[:, None].repeat(c, 1) for cs in cost]  # each part's best
        # pairs: (c of part 0, part 1's best), (part 0's best, c of part 1); when the signs are
        # odd, the part of the c candidates flips one sign
        src = [np.where(odd[:, None], withf[h], bestp[h]) for h in range(2)]
        p0 = np.concatenate([src[0], one[0]], axis=1)
        p1 = np.concatenate([one[1], src[1]], axis=1)
        fpart = np.concatenate([np.zeros((rows, c), int), np.ones((rows, c), int)], axis=1)
        fpart = np.where(odd[:, None], fpart, -1)
        pts = np.stack([p0, p1], axis=2)
        fk = np.where(
            fpart == 1,
            np.take_along_axis(flip[1][1], p1, axis=1),
            np.take_along_axis(flip[0][1], p0, axis=1),
        )
    C = pts.shape[1]
    r = np.arange(rows)[:, None]
    negc = np.repeat(neg[:, None, :], C, axis=1)  # (R, C, 8)
    coord = np.where(fpart >= 0, fpart * dims + fk, 0)
    rr, cc = np.nonzero(fpart >= 0)
    negc[rr, cc, coord[rr, cc]] ^= True
    vals = (db[:, None, None] * g[pts].reshape(rows, C, GROUP)) * np.where(negc, F32(-1), F32(1))
    best = best_under(w, vals, M)
    gi = pts[r[:, 0], best]  # (R, parts)
    nb = negc[r[:, 0], best]  # (R, 8)
    bits = (nb.astype(np.int64) << np.arange(GROUP)).sum(axis=1)
    if _parity(name):
        bits &= 127
    return gi.astype(np.int64), bits, vals[r[:, 0], best].astype(F32)


class _LatticeCodec:
    """A lattice type's codes for :func:`lowbit.methods._iq_walk.walk`: per group of 8 the
    grid indices (one or two) and the sign bits."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dims = grid(name).shape[1]
        self.width = GROUP // self.dims + 1

    def fit(self, xs: np.ndarray, qw: np.ndarray | None) -> dict[str, np.ndarray]:
        return iq_lattice.fit_lattice(self.name, xs, qw)

    def scales(self, fit: dict[str, np.ndarray]) -> tuple[np.ndarray, None]:
        db = block_scales(self.name, fit["d"], fit["ls"])
        return np.repeat(db, _block(self.name) // GROUP, axis=1), None

    def round(self, db: np.ndarray, aux: None, w: np.ndarray, M: np.ndarray) -> tuple:
        gi, bits, q = round_group(self.name, db, w, M)
        return np.concatenate([gi, bits[:, None]], axis=1), q

    def pack(self, fits: list, codes: np.ndarray) -> np.ndarray:
        rows, groups, _ = codes.shape
        gi = codes[..., :-1].reshape(rows, groups * GROUP // self.dims)
        return _pack(self.name, fits, gi, codes[..., -1], rows, groups * GROUP // QK_K)


def solve_lattice(
    W: np.ndarray, H: np.ndarray, target: Any, damp: float, static: bool, refit: bool = True
) -> np.ndarray:
    """GPTQ of ``W`` (float64 ``[rows, cols]``, modified) onto ``target``'s i-quant type.

    Args:
        W: the weight (written into).
        H: its inputs' Hessian ``[cols, cols]`` (float64, read only).
        target: a :class:`~lowbit.methods._ggml_gptq.GgmlTarget` of an :data:`IQ_TYPES` type,
            its importance resolved.
        damp: GPTQ's dampening (fraction of the mean diagonal).
        static: groups of 8 in descending ``diag(H)`` order, scales fitted up front.
        refit: after the walk, each super-block's ``d`` refitted to the codes.

    Returns:
        uint8 ``(rows, row bytes)``: the tensor's GGUF bytes.

    Raises:
        LowbitError: rows that are not whole super-blocks; no importance vector for a type
            whose search needs one.
    """
    name = target.qtype
    im = None if target.importance is None else np.asarray(target.importance, F32)
    if W.shape[1] % QK_K:
        raise LowbitError(f"{name} stores rows in blocks of {QK_K}; rows of {W.shape[1]} are not")
    if im is None and name in blocks.NEEDS_IMATRIX:
        raise LowbitError(f"{name} needs an importance vector (llama.cpp's search has none)")
    codec = IQ1Codec(name) if name in IQ1_TYPES else _LatticeCodec(name)
    return walk(W, H, codec, im, damp, static, refit)


def _pack(name: str, fits: list, gi: np.ndarray, sg: np.ndarray, rows: int, nsb: int) -> np.ndarray:
    """The GGUF bytes ``(rows, row bytes)`` of the walk's codes on the fitted scales."""
    per = {key: np.stack([f[key] for f in fits], axis=1) for key in ("d", "ls", "zero")}
    fit = {k: v.reshape(rows * nsb, *v.shape[2:]) for k, v in per.items()}
    gi = gi.reshape(rows * nsb, -1)
    sg = sg.reshape(rows * nsb, -1)
    empty = fit["d"] == 0  # a super-block that decodes to zero: the codes llama.cpp writes
    if name in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS"):
        gi[empty] = 0
        sg[empty] = 0
    data = iq_lattice.pack_lattice(name, fit, gi, sg)
    return np.ascontiguousarray(data.reshape(rows, -1))
