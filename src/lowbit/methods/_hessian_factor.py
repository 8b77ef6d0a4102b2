"""GPTQ's factor of the Hessian: the damped, upper Cholesky factor of its inverse that the column loop walks.

Two ways to the same factor. Below :data:`_BLOCKED_FROM` inputs, numpy's ``cholesky`` and a
block inverse: the bytes every golden test pins. From that width on (Llama-3.1-8B's 4,096 and
14,336), the factor is made in one ``n x n`` float64 matrix besides the caller's ``H``: the
permuted, reversed copy is factored in place by a blocked Cholesky and inverted in place by a
blocked triangular inverse (matrix products on panels of :data:`_PANEL` columns, numpy having
no ``potrf`` or ``trtri`` that work in place), then reversed in place. numpy's ``cholesky``
alone holds three matrices (its input, its work copy, its result): at down_proj's 14,336
inputs the old way peaked at four 1.64 GB matrices, this one at two. Its values agree with the
old way's to float64 rounding (``tests/methods/test_hessian_factor_memory.py``), not bit for
bit: a different order of the same sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lowbit.errors import LowbitError


def _upper_cholesky_of_inverse(H: np.ndarray) -> np.ndarray:
    """``U`` upper triangular with ``U^T U = H^-1`` (the paper's ``Cholesky(H^-1)^T``).

    One Cholesky factorisation and one triangular inverse: with ``J`` the reversal
    permutation and ``J H J = L L^T``, ``H = R R^T`` for the upper ``R = J L J``, so
    ``H^-1 = R^-T R^-1`` and ``U = R^-1 = J L^-1 J``.
    """
    return _reversed_in_place(_lower_inverse(_reversed_cholesky(H)))


def _reversed_cholesky(H: np.ndarray) -> np.ndarray:
    """``L`` lower triangular with ``J H J = L L^T`` (``J`` the reversal)."""
    try:
        return np.linalg.cholesky(H[::-1, ::-1])
    except np.linalg.LinAlgError:
        raise LowbitError(
            "the dampened Hessian is not positive definite; raise damp (e.g. 0.1)"
        ) from None


def _reversed_in_place(A: np.ndarray) -> np.ndarray:
    """``A[::-1, ::-1]`` in ``A``'s own memory, row pair by row pair (the copy
    ``np.ascontiguousarray`` made was one more ``n x n`` float64 matrix at the solve's peak:
    1.6 GB at Llama-3.1-8B's down_proj). Moves values only: bitwise the reversed copy."""
    n = A.shape[0]
    for i in range(n // 2):
        j = n - 1 - i
        top = A[i, ::-1].copy()
        A[i] = A[j, ::-1]
        A[j] = top
    if n % 2:
        A[n // 2] = A[n // 2, ::-1].copy()
    return A


def _lower_inverse(L: np.ndarray) -> np.ndarray:
    """Inverse of a lower-triangular matrix by blocks (matrix products; numpy has no trtri):
    ``[[A, 0], [B, C]]^-1 = [[A^-1, 0], [-C^-1 B A^-1, C^-1]]``."""
    n = L.shape[0]
    if n <= 128:
        return np.tril(np.linalg.inv(L))
    h = n // 2
    Ai = _lower_inverse(L[:h, :h])
    Ci = _lower_inverse(L[h:, h:])
    out = np.zeros_like(L)
    out[:h, :h] = Ai
    out[h:, h:] = Ci
    out[h:, :h] = -(Ci @ (L[h:, :h] @ Ai))
    return out


@dataclass(frozen=True)
class _Factor:
    """What GPTQ needs from a Hessian, shared by every layer that reads the same inputs
    (q/k/v, gate/up): the column order, the dead inputs and ``U`` (upper Cholesky of the
    dampened, permuted ``H``'s inverse)."""

    perm: np.ndarray
    dead: np.ndarray
    U: np.ndarray


def _factor(H: np.ndarray, damp: float, static_order: bool) -> _Factor:
    """Factor ``H``: dead inputs (zero diagonal) set to 1, columns in descending diagonal
    order when ``static_order`` (GPTQ's static act-order), ``damp`` times the mean diagonal
    added to it. ``H`` is only read."""
    if H.shape[0] >= _BLOCKED_FROM:
        return _factor_blocked(H, damp, static_order)
    H = H.copy()
    n = H.shape[0]
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    if static_order:
        perm = np.argsort(-np.diag(H), kind="stable")
        H = H[perm][:, perm]
    else:
        perm = np.arange(n)
    H[np.diag_indices(n)] += damp * float(np.mean(np.diag(H)))
    L = _reversed_cholesky(H)
    del H  # these copies are done with: an n x n float64 matrix less at each step
    U = _lower_inverse(L)
    del L
    return _Factor(perm=perm, dead=dead, U=_reversed_in_place(U))


#: inputs from which the factor is made in place (below: numpy's cholesky, bit for bit as before)
_BLOCKED_FROM = 4096
#: columns per panel of the blocked factor: products of (n x 256) panels run near the matrix
#: rate, and each temporary is one panel (29 MB at 14,336 inputs)
_PANEL = 256


def _factor_blocked(H: np.ndarray, damp: float, static_order: bool, panel: int = _PANEL) -> _Factor:
    """:func:`_factor`'s result with one ``n x n`` float64 matrix besides ``H``: the same
    dead inputs, order and dampening, the factor made in place (module docstring)."""
    n = H.shape[0]
    d = np.diag(H).copy()
    dead = d == 0
    d[dead] = 1.0
    perm = np.argsort(-d, kind="stable") if static_order else np.arange(n)
    dp = d[perm]
    mu = damp * float(np.mean(dp))  # the mean of the permuted diagonal, as _factor takes it
    rev = perm[::-1]
    A = H[np.ix_(rev, rev)]  # J P^T H P J in one new matrix: no copy, no reversal pass
    A[np.diag_indices(n)] = dp[::-1] + mu
    _cholesky_in_place(A, panel)
    _lower_inverse_in_place(A, panel)
    return _Factor(perm=perm, dead=dead, U=_reversed_in_place(A))


def _cholesky_in_place(A: np.ndarray, panel: int = _PANEL) -> np.ndarray:
    """``A``'s lower Cholesky factor written over ``A`` (its upper triangle set to 0).

    Left-looking by panels of columns: a panel takes the products of the rows' finished
    columns (one ``(n - j) x j`` by ``j x panel`` product), then its diagonal block is
    factored by numpy and the rows below solved against it. ``n³/3`` operations, as LAPACK's
    ``potrf``; the temporaries are one panel.

    Raises:
        LowbitError: ``A`` is not positive definite.
    """
    n = A.shape[0]
    for j0 in range(0, n, panel):
        j1 = min(j0 + panel, n)
        if j0:
            A[j0:, j0:j1] -= A[j0:, :j0] @ A[j0:j1, :j0].T
        try:
            Ljj = np.linalg.cholesky(A[j0:j1, j0:j1])
        except np.linalg.LinAlgError:
            raise LowbitError(
                "the dampened Hessian is not positive definite; raise damp (e.g. 0.1)"
            ) from None
        A[j0:j1, j0:j1] = Ljj
        A[j0:j1, j1:] = 0.0
        if j1 < n:  # L21 = A21 Ljj^-T
            A[j1:, j0:j1] = np.linalg.solve(Ljj, A[j1:, j0:j1].T).T
    return A


def _lower_inverse_in_place(L: np.ndarray, panel: int = _PANEL) -> np.ndarray:
    """The inverse of the lower-triangular ``L`` (zeros above the diagonal) written over it.

    By panels from the last: with the trailing part ``C`` already inverted,
    ``[[A, 0], [B, C]]^-1 = [[A^-1, 0], [-C^-1 B A^-1, C^-1]]``; ``C^-1 B`` is made over ``B``
    row block by row block from the bottom (a row block reads only ``B``'s rows above it and
    ``C^-1``'s lower triangle), so about ``n³/3`` operations (LAPACK's ``trtri``) where the
    recursive :func:`_lower_inverse` takes ``n³`` and whole-matrix copies.
    """
    n = L.shape[0]
    for j0 in reversed(range(0, n, panel)):
        j1 = min(j0 + panel, n)
        Ai = np.tril(np.linalg.inv(L[j0:j1, j0:j1]))
        if j1 < n:
            for r0 in reversed(range(j1, n, panel)):
                r1 = min(r0 + panel, n)
                L[r0:r1, j0:j1] = L[r0:r1, j1:r1] @ L[j1:r1, j0:j1]
            L[j1:, j0:j1] = -(L[j1:, j0:j1] @ Ai)
        L[j0:j1, j0:j1] = Ai
    return L
