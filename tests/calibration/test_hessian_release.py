"""HessianCollector.hessian(release=True): the Hessian built in the collector's own sum is the
copied one bit for bit (signed zeros included), and the sum is dropped; a window's float32 sum
is added to the float64 total without a float64 copy, bit for bit."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from lowbit.calibration.hessians import HessianCollector, _add_window, _symmetric_in_place
from lowbit.errors import LowbitError


@pytest.mark.parametrize("n", [1, 7, 512, 513, 1100])
def test_in_place_is_the_expression_bit_for_bit(n: int, rng: np.random.Generator) -> None:
    S = rng.standard_normal((n, n))
    S[rng.random((n, n)) < 0.05] = -0.0  # the sum with the zero triangle makes these +0.0
    want = (2.0 / 3.0) * (np.triu(S) + np.triu(S, 1).T)
    got = _symmetric_in_place(S.copy(), 2.0 / 3.0)
    assert got.tobytes() == want.tobytes()


def test_release_drops_the_sum(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(40, 8)
    x = torch.from_numpy(rng.standard_normal((3, 5, 40)).astype(np.float32))
    kept = []
    for release in (False, True):
        with HessianCollector({"l": lin}) as col, torch.inference_mode():
            for i in range(3):
                col.next_sample(None)
                col.run(lin, x[i : i + 1])
        kept.append(col.hessian("l", release=release))
    assert kept[0].tobytes() == kept[1].tobytes()
    assert col.tokens("l") == 15
    with pytest.raises(LowbitError, match="no Hessian"):
        col.hessian("l")


def test_release_of_read_only_sums(rng: np.random.Generator) -> None:
    """Sums handed over read-only (Ray's object store gives a worker's reduced sums so) are
    copied once, not written into: the same Hessian bit for bit."""
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(24, 4)
    x = torch.from_numpy(rng.standard_normal((2, 5, 24)).astype(np.float32))
    kept = []
    for read_only in (False, True):
        with HessianCollector({"l": lin}) as col, torch.inference_mode():
            for i in range(2):
                col.next_sample(None)
                col.run(lin, x[i : i + 1])
        col._flush(col._group("l"))
        if read_only:
            for total in col._total.values():
                total.flags.writeable = False
        kept.append(col.hessian("l", release=True))
    assert kept[0].tobytes() == kept[1].tobytes()


def test_window_added_without_a_float64_copy(rng: np.random.Generator) -> None:
    """The float32 window widened inside the addition: the very sum of ``astype`` then ``+=``,
    with no ``n x n`` float64 temporary (numpy's arrays are traced by tracemalloc)."""
    n = 700
    total = rng.standard_normal((n, n)) * 1e3
    part = (rng.standard_normal((n, n)) * 1e5).astype(np.float32)
    want = total + part.astype(np.float64)
    totals = {"g": total.copy()}
    tracemalloc.start()
    try:
        _add_window(totals, "g", part)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert totals["g"].tobytes() == want.tobytes()
    assert peak < n * n * 8 / 4, peak
    first: dict[str, np.ndarray] = {}
    _add_window(first, "g", part)
    assert (
        first["g"].dtype == np.float64 and first["g"].tobytes() == part.astype(np.float64).tobytes()
    )


def test_many_windows_sum_as_float64_additions(rng: np.random.Generator) -> None:
    """Passes past FLUSH: each window's float32 sum added to the float64 total in order."""
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(16, 4)
    x = torch.from_numpy(
        rng.standard_normal((HessianCollector.FLUSH * 2 + 3, 5, 16)).astype(np.float32)
    )
    with HessianCollector({"l": lin}) as col, torch.inference_mode():
        for i in range(x.shape[0]):
            col.next_sample(None)
            col.run(lin, x[i : i + 1])
    S = col.hessian("l", release=True)
    want = None
    for w0 in range(0, x.shape[0], HessianCollector.FLUSH):
        acc = torch.zeros((16, 16))
        for i in range(w0, min(w0 + HessianCollector.FLUSH, x.shape[0])):
            xi = x[i]
            for a in range(0, 16, 4):
                acc[a : a + 4, a:].addmm_(xi[:, a : a + 4].T, xi[:, a:])
        w = acc.numpy().astype(np.float64)
        want = w if want is None else want + w
    assert S.tobytes() == _symmetric_in_place(want, 2.0 / (5 * x.shape[0])).tobytes()
