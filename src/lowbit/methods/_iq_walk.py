"""GPTQ's column walk for vector codes: groups of 8 columns, each one code per row.

Shared by the lattice i-quants (:mod:`lowbit.methods._iq_gptq`) and IQ1_S/IQ1_M
(:mod:`lowbit.methods._iq1_gptq`), which differ only in their :class:`Codec`: llama.cpp's scale
search on a super-block of 256 columns, the scales it gives each group of 8, the choice of one
group's code, and the block bytes. The walk (GPTVQ-style):

- the scales: each super-block gets the codec's search on the values as GPTQ has updated them
  when the walk reaches it (``static`` False: columns in order, lazy batches of 256), or on the
  original values up front (``static``: the groups of 8 in descending order of their
  ``diag(H)`` sum).
- the rounding: with ``U`` the upper Cholesky factor of the damped inverse Hessian (as
  :mod:`lowbit.methods.gptq`), the output error a group's choice leaves after the later columns
  absorb it is ``e^T M e``, ``e`` the group's rounding error and ``M = (U_gg^T U_gg)^-1`` for its
  8x8 diagonal block. The codec scores every code under ``diag(M)`` (:func:`diag_costs`), then
  its :data:`TOP` best under the full ``M`` (:func:`best_under`).
- the error: ``err = U_gg^-T e`` moves onto the later columns as GPTQ moves it
  (``W[later] -= U[g, later]^T err``), which the 8 one-column steps would do for the same choice.

With a diagonal Hessian no error moves and every group takes the code nearest the weights under
``diag(H)`` at llama.cpp's scales: at most llama.cpp's weighted error.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, Protocol

import numpy as np

from lowbit.errors import LowbitError
from lowbit.ggml import blocks
from lowbit.ggml._search import F32, f16_bytes, read_f16
from lowbit.ggml.iq_grids import decode_grid
from lowbit.methods._hessian_factor import _factor

__all__ = ["GROUP", "QK_K", "TOP", "Codec", "best_under", "diag_costs", "grid", "walk"]

QK_K = 256
GROUP = 8  # columns per step: one code group
TOP = 8  # candidates rescored under the full metric


class Codec(Protocol):
    """One type's codes as the walk uses them."""

    name: str
    """The GGUF type (``"IQ2_XXS"``)."""
    width: int
    """Integers per group's code."""

    def fit(self, xs: np.ndarray, qw: np.ndarray | None) -> dict[str, np.ndarray]:
        """llama.cpp's search on one super-block of every row (``xs`` float32 (rows, 256),
        importance weights ``qw`` alike or None); ``"d"``: the float32 value each row stores as
        float16."""

    def scales(self, fit: dict[str, np.ndarray]) -> tuple[np.ndarray, Any]:
        """Each group's decoded scale (rows, 32) float32, and what else its choice needs
        (rows, 32) (or None)."""

    def round(
        self, db: np.ndarray, aux: Any, w: np.ndarray, M: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """One group's codes (R, width) int64 and decoded values (R, 8) float32, for values
        ``w`` (R, 8) under metric ``M`` (8, 8)."""

    def pack(self, fits: list[dict[str, np.ndarray]], codes: np.ndarray) -> np.ndarray:
        """The GGUF bytes (rows, row bytes) of the fits with codes (rows, cols/8, width)."""


@cache
def grid(name: str) -> np.ndarray:
    """``name``'s (points, dims) float32 decoder grid, read-only."""
    g = decode_grid(name)
    g.setflags(write=False)
    return g


def diag_costs(g: np.ndarray, a: np.ndarray, db: np.ndarray, dv: np.ndarray) -> np.ndarray:
    """(R, P): ``sum_k dv_k (db*g_pk - a_k)^2`` up to a per-row constant, for grid points ``g``
    (P, n), targets ``a`` (R, n), scales ``db`` (R,) and the metric's diagonal ``dv`` (n,)."""
    g64 = g.astype(np.float64)
    return (db * db)[:, None] * ((g64 * g64) @ dv)[None, :] - 2 * db[:, None] * ((a * dv) @ g64.T)


def best_under(w: np.ndarray, vals: np.ndarray, M: np.ndarray) -> np.ndarray:
    """(R,) index of each row's candidate (``vals`` (R, C, 8)) of least ``e^T M e``,
    ``e = w - vals``."""
    e = w[:, None, :] - vals.astype(np.float64)
    return np.einsum("rci,ij,rcj->rc", e, M, e).argmin(axis=1)


def _group_order(H: np.ndarray) -> np.ndarray:
    """Column order of static act-order for vector codes: groups of 8 kept whole, in
    descending order of their ``diag(H)`` sum (stable)."""
    s = np.diag(H).reshape(-1, GROUP).sum(axis=1)
    g = np.argsort(-s, kind="stable")
    return (g[:, None] * GROUP + np.arange(GROUP)).reshape(-1)


def walk(
    W: np.ndarray,
    H: np.ndarray,
    codec: Codec,
    im: np.ndarray | None,
    damp: float,
    static: bool,
    refit: bool = True,
) -> np.ndarray:
    """GPTQ of ``W`` (float64 ``[rows, cols]``, modified) onto ``codec``'s type.

    Args:
        W: the weight (written into).
        H: its inputs' Hessian ``[cols, cols]`` (float64, read only).
        codec: the type's codes.
        im: the importance vector (cols,) float32 llama.cpp's search weighs with, or None.
        damp: GPTQ's dampening (fraction of the mean diagonal).
        static: groups of 8 in descending ``diag(H)`` order, scales fitted up front.
        refit: after the walk, each super-block's ``d`` refitted to the codes (:func:`_refit_d`).

    Returns:
        uint8 ``(rows, row bytes)``: the tensor's GGUF bytes.

    Raises:
        LowbitError: rows that are not whole super-blocks.
    """
    name = codec.name
    rows, cols = W.shape
    if cols % QK_K:
        raise LowbitError(f"{name} stores rows in blocks of {QK_K}; rows of {cols} are not")
    nsb = cols // QK_K
    dead = np.diag(H) == 0
    W[:, dead] = 0.0
    W0 = W.copy() if refit else W
    perm = _group_order(H) if static else np.arange(cols)
    U = _factor(H[np.ix_(perm, perm)] if static else H, damp, False).U
    fits: list[dict[str, np.ndarray]] = [{}] * nsb
    scl: list[tuple[np.ndarray, Any]] = [(np.zeros(0), None)] * nsb

    def fit(k: int, values: np.ndarray) -> None:
        xs = np.ascontiguousarray(values, dtype=F32)
        qw = None
        if im is not None:
            qw = np.ascontiguousarray(np.broadcast_to(im[k * QK_K : (k + 1) * QK_K], xs.shape))
        fits[k] = codec.fit(xs, qw)
        scl[k] = codec.scales(fits[k])

    if static:
        for k in range(nsb):
            fit(k, W[:, k * QK_K : (k + 1) * QK_K])
    codes = np.zeros((rows, cols // GROUP, codec.width), np.int64)
    Wt = np.ascontiguousarray(W.T[perm])
    for i1 in range(0, cols, QK_K):
        i2 = min(i1 + QK_K, cols)
        W1 = Wt[i1:i2].copy()
        E1 = np.empty_like(W1)
        U1 = U[i1:i2, i1:i2]
        for g0 in range(0, i2 - i1, GROUP):
            col = int(perm[i1 + g0])
            k = col // QK_K
            if not static and col % QK_K == 0:
                fit(k, W1[g0 : g0 + QK_K].T)
            j = (col % QK_K) // GROUP
            db, aux = scl[k]
            Ug = U1[g0 : g0 + GROUP, g0 : g0 + GROUP]
            M = np.linalg.inv(Ug.T @ Ug)
            M = (M + M.T) / 2
            c, q = codec.round(
                db[:, j], None if aux is None else aux[:, j], W1[g0 : g0 + GROUP].T, M
            )
            codes[:, col // GROUP] = c
            err = np.linalg.solve(Ug.T, W1[g0 : g0 + GROUP] - q.T.astype(np.float64))
            if g0 + GROUP < i2 - i1:
                W1[g0 + GROUP :] -= U1[g0 : g0 + GROUP, g0 + GROUP :].T @ err
            E1[g0 : g0 + GROUP] = err
        if i2 < cols:
            Wt[i2:] -= U[i1:i2, i2:].T @ E1
    data = codec.pack(fits, codes)
    if refit:
        data = _refit_d(name, W0, H, fits, lambda: codec.pack(fits, codes), data)
    return data


def _refit_d(
    name: str, W0: np.ndarray, H: np.ndarray, fits: list, pack: Callable[[], np.ndarray], data
) -> np.ndarray:
    """Refit each row's super-block scale ``d`` to the codes the walk chose, one super-block
    after another, as the least-squares optimum of the layer error ``tr((W - Q) H (W - Q)^T)``
    (a quadratic in ``d``; the codes and block scales kept: every decoded value is ``d`` times
    a factor the codes fix, and ``d`` is stored as a float16 of its own, so the new one packs
    exactly). Kept where it lowers the error after ``d``'s float16 rounding, so the error never
    rises."""
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
    return pack()
