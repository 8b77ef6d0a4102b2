"""GPTQ's factor of the Hessian: the damped, upper Cholesky factor of its inverse that the column loop walks."""

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
    added to it."""
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
