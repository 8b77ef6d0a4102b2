"""lowbit.methods._hessian_factor: the factor made with fewer copies (reversal in place, the
dampened copy dropped before the inverse) is bitwise the one made with copies."""

from __future__ import annotations

import numpy as np
import pytest

from lowbit.methods._hessian_factor import (
    _factor,
    _lower_inverse,
    _reversed_in_place,
    _upper_cholesky_of_inverse,
)


@pytest.mark.parametrize("n", [1, 2, 5, 6, 300])
def test_reversed_in_place_is_the_reversed_copy(n: int, rng: np.random.Generator) -> None:
    A = rng.standard_normal((n, n))
    want = np.ascontiguousarray(A[::-1, ::-1])
    assert _reversed_in_place(A).tobytes() == want.tobytes()


@pytest.mark.parametrize("n", [7, 129, 300])
@pytest.mark.parametrize("static", [False, True])
def test_factor_is_the_copying_one_bit_for_bit(
    n: int, static: bool, rng: np.random.Generator
) -> None:
    X = rng.standard_normal((2 * n, n))
    H = X.T @ X
    H[3, :] = H[:, 3] = 0.0  # a dead input
    got = _factor(H, 0.01, static)
    # the copying formulation, written out
    Hc = H.copy()
    dead = np.diag(Hc) == 0
    Hc[dead, dead] = 1.0
    perm = np.argsort(-np.diag(Hc), kind="stable") if static else np.arange(n)
    Hc = Hc[perm][:, perm]
    Hc[np.diag_indices(n)] += 0.01 * float(np.mean(np.diag(Hc)))
    L = np.linalg.cholesky(Hc[::-1, ::-1])
    want = np.ascontiguousarray(_lower_inverse(L)[::-1, ::-1])
    assert got.U.tobytes() == want.tobytes()
    assert got.U.tobytes() == _upper_cholesky_of_inverse(Hc).tobytes()
    assert np.array_equal(got.perm, perm) and np.array_equal(got.dead, dead)
