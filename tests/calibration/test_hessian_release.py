"""HessianCollector.hessian(release=True): the Hessian built in the collector's own sum is the
copied one bit for bit (signed zeros included), and the sum is dropped."""

from __future__ import annotations

import numpy as np
import pytest

from lowbit.calibration.hessians import HessianCollector, _symmetric_in_place
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
