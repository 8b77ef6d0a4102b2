"""GPTQ onto llama.cpp's lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): vector codes.

In these types 8 weights (IQ2) or 4 (IQ3) are one point of a grid
(:mod:`lowbit.ggml.iq_grids`) times a sign per weight, and the signs come in groups of 8, which
for IQ2_XXS, IQ2_XS and IQ3_XXS must hold an even number of minus signs (7 bits stored, the
eighth their parity). A column therefore cannot be rounded alone: this walk takes the columns in
groups of 8 (one sign group: one IQ2 point, two IQ3 points), GPTVQ-style:

- the scales: each super-block of 256 columns gets llama.cpp's own search
  (:func:`lowbit.ggml.iq_lattice.fit_lattice`: ``d`` and the 4-bit block scales, with the
  importance matrix, else ``diag(H)``, as :class:`~lowbit.methods._ggml_gptq.GgmlTarget`
  resolves it), on the values as GPTQ has updated them when the walk reaches the super-block
  (``act_order="none"``: columns in order, lazy batches of 256), or on the original values up
  front (``act_order="static"``: the groups of 8 in descending order of their ``diag(H)`` sum).
- the rounding: with ``U`` the upper Cholesky factor of the damped inverse Hessian (as
  :mod:`lowbit.methods.gptq`), the output error a group's choice leaves after the later columns
  absorb it is ``e^T M e``, ``e`` the group's rounding error and ``M = (U_gg^T U_gg)^-1`` for its
  8x8 diagonal block. Every allowed point (each grid point on the *decoded* grid, ``db*grid``,
  with its best signs: those of the weights, or where parity forbids, one flipped at the least
  cost) is scored under ``diag(M)`` (a matrix product over the whole grid), then the ``top``
  best are scored again under the full ``M`` and the best is kept.
- the error: ``err = U_gg^-T e`` moves onto the later columns as GPTQ moves it
  (``W[later] -= U[g, later]^T err``), which the 8 one-column steps would do for the same choice.

The chosen grid indices and signs are packed with llama.cpp's scales into the type's block bytes
(:func:`lowbit.ggml.iq_lattice.pack_lattice`), so ggml and gguf-py decode exactly the values the
walk used. With a diagonal Hessian no error moves and every group takes the grid point nearest
the weights under ``diag(H)`` at llama.cpp's scales: at most llama.cpp's weighted error.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.ggml import blocks, iq_lattice
from lowbit.ggml._search import F32, f16_bytes, read_f16
from lowbit.ggml.iq_grids import decode_grid
from lowbit.methods._hessian_factor import _factor

__all__ = ["LATTICE_TYPES", "block_scales", "round_group", "solve_lattice"]

LATTICE_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
"""The i-quant types GPTQ rounds onto as vector codes."""

QK_K = 256
GROUP = 8  # columns per step: one sign group
TOP = 8  # candidates rescored under the full metric


@cache
def _grid(name: str) -> np.ndarray:
    """(points, dims) float32 decoder grid, read-only."""
    g = decode_grid(name)
    g.setflags(write=False)
    return g


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


def _values(name: str, db: np.ndarray, gi: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """(R, 8) float32 decoded values, ``(db*grid)*sign`` as the decoders (``neg`` (R, 8) bool)."""
    g = _grid(name)[gi].reshape(gi.shape[0], GROUP)
    return ((db[:, None] * g) * np.where(neg, F32(-1), F32(1))).astype(F32)


def _half_costs(g: np.ndarray, a: np.ndarray, db: np.ndarray, dv: np.ndarray) -> np.ndarray:
    """(R, P): ``sum_k dv_k (db*g_pk - a_k)^2`` up to a per-row constant."""
    g64 = g.astype(np.float64)
    return (db * db)[:, None] * ((g64 * g64) @ dv)[None, :] - 2 * db[:, None] * ((a * dv) @ g64.T)


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
    g = _grid(name)
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
    cost = [_half_costs(g, a[:, s], db64, dv[s]) for s in sl]
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
    e = w[:, None, :] - vals.astype(np.float64)
    score = np.einsum("rci,ij,rcj->rc", e, M, e)
    best = score.argmin(axis=1)
    gi = pts[r[:, 0], best]  # (R, parts)
    nb = negc[r[:, 0], best]  # (R, 8)
    bits = (nb.astype(np.int64) << np.arange(GROUP)).sum(axis=1)
    if _parity(name):
        bits &= 127
    return gi.astype(np.int64), bits, vals[r[:, 0], best].astype(F32)


def _group_order(H: np.ndarray) -> np.ndarray:
    """Column order of static act-order for vector codes: groups of 8 kept whole, in
    descending order of their ``diag(H)`` sum (stable)."""
    s = np.diag(H).reshape(-1, GROUP).sum(axis=1)
    g = np.argsort(-s, kind="stable")
    return (g[:, None] * GROUP + np.arange(GROUP)).reshape(-1)


def solve_lattice(
    W: np.ndarray, H: np.ndarray, target: Any, damp: float, static: bool, refit: bool = True
) -> np.ndarray:
    """GPTQ of ``W`` (float64 ``[rows, cols]``, modified) onto ``target``'s i-quant type.

    Args:
        W: the weight (written into).
        H: its inputs' Hessian ``[cols, cols]`` (float64, read only).
        target: a :class:`~lowbit.methods._ggml_gptq.GgmlTarget` of a :data:`LATTICE_TYPES` type,
            its importance resolved.
        damp: GPTQ's dampening (fraction of the mean diagonal).
        static: groups of 8 in descending ``diag(H)`` order, scales fitted up front.
        refit: after the walk, each super-block's ``d`` refitted to the codes (:func:`_refit_d`).

    Returns:
        uint8 ``(rows, row bytes)``: the tensor's GGUF bytes.
    """
    name = target.qtype
    rows, cols = W.shape
    if cols % QK_K:
        raise LowbitError(f"{name} stores rows in blocks of {QK_K}; rows of {cols} are not")
    nsb = cols // QK_K
    dead = np.diag(H) == 0
    W[:, dead] = 0.0
    W0 = W.copy() if refit else W
    perm = _group_order(H) if static else np.arange(cols)
    f = _factor(H[np.ix_(perm, perm)] if static else H, damp, False)
    U = f.U
    im = None if target.importance is None else np.asarray(target.importance, F32)
    if im is None and name in blocks.NEEDS_IMATRIX:
        raise LowbitError(f"{name} needs an importance vector (llama.cpp's search has none)")
    fits: list[dict[str, np.ndarray] | None] = [None] * nsb
    dbs: list[np.ndarray | None] = [None] * nsb

    def fit(k: int, values: np.ndarray) -> None:
        xs = np.ascontiguousarray(values, dtype=F32)
        qw = None
        if im is not None:
            qw = np.ascontiguousarray(np.broadcast_to(im[k * QK_K : (k + 1) * QK_K], xs.shape))
        fits[k] = iq_lattice.fit_lattice(name, xs, qw)
        dbs[k] = block_scales(name, fits[k]["d"], fits[k]["ls"])

    if static:
        for k in range(nsb):
            fit(k, W[:, k * QK_K : (k + 1) * QK_K])
    dims = _grid(name).shape[1]
    gi_all = np.zeros((rows, cols // dims), np.int64)
    sg_all = np.zeros((rows, cols // GROUP), np.int64)
    Wt = np.ascontiguousarray(W.T[perm])
    step = QK_K
    blk = _block(name)
    for i1 in range(0, cols, step):
        i2 = min(i1 + step, cols)
        W1 = Wt[i1:i2].copy()
        E1 = np.empty_like(W1)
        U1 = U[i1:i2, i1:i2]
        for g0 in range(0, i2 - i1, GROUP):
            col = int(perm[i1 + g0])
            k = col // QK_K
            if not static and col % QK_K == 0:
                fit(k, W1[g0 : g0 + QK_K].T)
            db = dbs[k][:, (col % QK_K) // blk]  # type: ignore[index]
            Ug = U1[g0 : g0 + GROUP, g0 : g0 + GROUP]
            M = np.linalg.inv(Ug.T @ Ug)
            M = (M + M.T) / 2
            gi, bits, q = round_group(name, db, W1[g0 : g0 + GROUP].T, M)
            gi_all[:, col // dims : col // dims + GROUP // dims] = gi
            sg_all[:, col // GROUP] = bits
            err = np.linalg.solve(Ug.T, W1[g0 : g0 + GROUP] - q.T.astype(np.float64))
            if g0 + GROUP < i2 - i1:
                W1[g0 + GROUP :] -= U1[g0 : g0 + GROUP, g0 + GROUP :].T @ err
            E1[g0 : g0 + GROUP] = err
        if i2 < cols:
            Wt[i2:] -= U[i1:i2, i2:].T @ E1
    data = _pack(name, fits, gi_all, sg_all, rows, nsb)
    if refit:
        data = _refit_d(name, W0, H, fits, gi_all, sg_all, data)
    return data


def _refit_d(name, W0, H, fits, gi, sg, data) -> np.ndarray:
    """Refit each row's super-block scale ``d`` to the codes the walk chose, one super-block
    after another, as the least-squares optimum of the layer error ``tr((W - Q) H (W - Q)^T)``
    (a quadratic in ``d``; the codes and 4-bit block scales kept). Kept where it lowers the
    error after ``d``'s float16 rounding, so the error never rises."""
    rows, cols = W0.shape
    nsb = cols // QK_K
    Q = blocks.dequantize(data, name).reshape(rows, cols).astype(np.float64)
    R = W0 - Q
    HR = R @ H
    for k in range(nsb):
        sb = slice(k * QK_K, (k + 1) * QK_K)
        d_old = read_f16(f16_bytes(fits[k]["d"].astype(F32)), 0).astype(np.float64)
        live = d_old != 0
        C = np.zeros((rows, QK_K))
        C[live] = Q[live, sb] / d_old[live, None]
        CH = C @ H[sb, sb]
        den = np.einsum("ij,ij->i", CH, C)
        num = np.einsum("ij,ij->i", C, HR[:, sb])
        ok = live & (den > 0)
        delta = np.where(ok, num / np.where(ok, den, 1.0), 0.0)
        d_new = read_f16(f16_bytes((d_old + delta).astype(F32)), 0).astype(np.float64)
        delta = d_new - d_old
        gain = 2 * delta * num - delta * delta * den  # error decrease
        take = ok & (d_new > 0) & (gain > 0)
        delta = np.where(take, delta, 0.0)
        fits[k]["d"] = np.where(take, d_new, fits[k]["d"]).astype(F32)
        step = delta[:, None] * C
        R[:, sb] -= step
        HR -= step @ H[sb, :]
    return _pack(name, fits, gi, sg, rows, nsb)


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
