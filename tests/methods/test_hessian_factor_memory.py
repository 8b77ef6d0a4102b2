"""lowbit.methods._hessian_factor: the factor made with fewer copies (reversal in place, the
dampened copy dropped before the inverse) is bitwise the one made with copies; from
``_BLOCKED_FROM`` inputs the factor made in place by blocks agrees with it to rounding and
holds one matrix besides ``H``."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from lowbit.errors import LowbitError
from lowbit.methods import _hessian_factor as hf
from lowbit.methods._hessian_factor import (
    _cholesky_in_place,
    _factor,
    _factor_blocked,
    _lower_inverse,
    _lower_inverse_in_place,
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


# ---- the blocked factor of wide inputs ---------------------------------------------------


def _spd(n: int, rng: np.random.Generator) -> np.ndarray:
    X = rng.standard_normal((2 * n, n))
    return X.T @ X


@pytest.mark.parametrize(("n", "panel"), [(1, 4), (7, 3), (64, 16), (300, 16), (301, 32)])
def test_cholesky_in_place_factors_and_zeroes_the_upper_triangle(
    n: int, panel: int, rng: np.random.Generator
) -> None:
    H = _spd(n, rng)
    L = _cholesky_in_place(H.copy(), panel)
    assert not np.triu(L, 1).any()  # exactly lower triangular
    assert np.all(np.diag(L) > 0)
    np.testing.assert_allclose(L @ L.T, H, rtol=0, atol=1e-12 * np.abs(H).max())
    np.testing.assert_allclose(L, np.linalg.cholesky(H), rtol=0, atol=1e-12 * np.abs(L).max())


def test_cholesky_in_place_refuses_an_indefinite_matrix(rng: np.random.Generator) -> None:
    H = _spd(50, rng)
    H[40, 40] = -1.0  # in the fourth panel: found after three panels' updates
    with pytest.raises(LowbitError, match="not positive definite"):
        _cholesky_in_place(H, 13)


@pytest.mark.parametrize(("n", "panel"), [(1, 4), (7, 3), (300, 16), (301, 32)])
def test_lower_inverse_in_place_is_the_inverse(
    n: int, panel: int, rng: np.random.Generator
) -> None:
    L = np.linalg.cholesky(_spd(n, rng))
    got = _lower_inverse_in_place(L.copy(), panel)
    assert not np.triu(got, 1).any()
    np.testing.assert_allclose(got @ L, np.eye(n), rtol=0, atol=1e-12)
    want = _lower_inverse(L)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * np.abs(want).max())


@pytest.mark.parametrize(("n", "panel"), [(7, 3), (129, 16), (300, 16), (301, 64)])
@pytest.mark.parametrize("static", [False, True])
def test_blocked_factor_is_the_old_factor_to_rounding(
    n: int, panel: int, static: bool, rng: np.random.Generator
) -> None:
    H = _spd(n, rng)
    H[3, :] = H[:, 3] = 0.0  # a dead input
    keep = H.copy()
    got = _factor_blocked(H, 0.01, static, panel)
    want = _factor(H, 0.01, static)  # below _BLOCKED_FROM: numpy's cholesky
    assert H.tobytes() == keep.tobytes()  # only read
    assert np.array_equal(got.perm, want.perm) and np.array_equal(got.dead, want.dead)
    assert not np.tril(got.U, -1).any()  # exactly upper triangular
    np.testing.assert_allclose(got.U, want.U, rtol=0, atol=1e-13 * np.abs(want.U).max())
    # U^T U is the dampened, permuted H's inverse: U Hd U^T = I
    Hd = H.copy()
    Hd[got.dead, got.dead] = 1.0
    Hd = Hd[got.perm][:, got.perm]
    Hd[np.diag_indices(n)] += 0.01 * float(np.mean(np.diag(Hd)))
    np.testing.assert_allclose(got.U @ Hd @ got.U.T, np.eye(n), rtol=0, atol=1e-10)


def test_factor_takes_the_blocked_way_from_the_threshold(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    H = _spd(300, rng)
    below = _factor(H, 0.01, True)
    monkeypatch.setattr(hf, "_BLOCKED_FROM", 300)
    at = _factor(H, 0.01, True)
    assert at.U.tobytes() == _factor_blocked(H, 0.01, True).U.tobytes()
    assert at.U.tobytes() != below.U.tobytes()  # the other way: not bit for bit the same
    monkeypatch.setattr(hf, "_BLOCKED_FROM", 301)
    assert _factor(H, 0.01, True).U.tobytes() == below.U.tobytes()


def test_blocked_factor_holds_one_matrix_besides_h(rng: np.random.Generator) -> None:
    """numpy's arrays are traced by tracemalloc: the factor's peak of new memory is its one
    n x n matrix plus panels, where the old way holds several."""
    n, panel = 768, 64
    H = _spd(n, rng)
    matrix = n * n * 8
    tracemalloc.start()
    try:
        _factor_blocked(H, 0.01, True, panel)
        _, blocked = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        _factor(H, 0.01, True)
        _, old = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert blocked < 1.3 * matrix, blocked / matrix
    assert old > 1.9 * matrix, old / matrix  # the measure sees the old way's copies


def test_lazy_update_by_row_chunks_is_the_whole_product(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From _BLOCKED_FROM columns the column loop's update after each lazy batch runs by row
    chunks (its temporary a chunk, not the rest of the weight): the same codes and scales."""
    from lowbit.methods import gptq

    n, rows = 600, 16
    X = rng.standard_normal((2 * n, n)) * np.exp(rng.standard_normal(n))
    H = X.T @ X / n
    W = rng.standard_normal((rows, n)) * 0.02
    want = gptq.gptq_quantize(W, H, "int4:g32")
    monkeypatch.setattr(gptq, "_BLOCKED_FROM", 64)  # the loop only: the factor as before
    monkeypatch.setattr(gptq, "_UPDATE_VALUES", rows * 64)  # chunks of 64 rows of Wt
    got = gptq.gptq_quantize(W, H, "int4:g32")
    assert got.scale.tobytes() == want.scale.tobytes()
    assert got.codes.tobytes() == want.codes.tobytes()
    np.testing.assert_allclose(got.dequantize(), want.dequantize(), rtol=0, atol=0)
