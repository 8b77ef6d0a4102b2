"""lowbit.quant.metrics.error: MSE, RMSE, SQNR, max abs, relative Frobenius, cosine."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lowbit
from lowbit import LowbitError


def test_error_known_values() -> None:
    """x = [3, 4], x̂ = [3, 3]: mse 0.5, sqnr 10·log10(25/1), rel_fro 1/5, cosine 21/(5·√18)."""
    e = lowbit.error([3.0, 4.0], np.array([3.0, 3.0]))
    assert e["mse"] == 0.5
    assert e["rmse"] == math.sqrt(0.5)
    assert e["sqnr_db"] == pytest.approx(10 * math.log10(25.0))
    assert e["max_abs"] == 1.0
    assert e["rel_fro"] == pytest.approx(0.2)
    assert e["cosine"] == pytest.approx(21 / (5 * math.sqrt(18)))


def test_error_of_exact_and_zero() -> None:
    """Exact copies have infinite SQNR and cosine 1; an all-zero original is handled."""
    e = lowbit.error([1.0, -2.0], [1.0, -2.0])
    assert e["sqnr_db"] == math.inf and e["mse"] == 0 and e["cosine"] == pytest.approx(1.0)
    z = lowbit.error([0.0, 0.0], [0.0, 0.0])
    assert z["rel_fro"] == 0.0 and z["cosine"] == 1.0


def test_error_accepts_a_quantized_tensor(rng: np.random.Generator) -> None:
    """error(x, qt) dequantizes exactly (float64) and agrees with error(x, deq64)."""
    x = rng.standard_normal((16, 64)).astype(np.float32)
    qt = lowbit.quantize(x, "int4", group_size=32)
    assert lowbit.error(x, qt) == lowbit.error(x, qt.dequantize(np.float64))
    assert 15 < lowbit.error(x, qt)["sqnr_db"] < 25


def test_sqnr_grows_about_6db_per_bit(rng: np.random.Generator) -> None:
    """Uniform data, per-tensor ints: each extra bit adds about 6.02 dB of SQNR."""
    x = rng.uniform(-1, 1, 200_000).astype(np.float32)
    s6 = lowbit.error(x, lowbit.quantize(x, "int6"))["sqnr_db"]
    s8 = lowbit.error(x, lowbit.quantize(x, "int8"))["sqnr_db"]
    assert s8 - s6 == pytest.approx(2 * 6.02, abs=0.3)


def test_error_skips_nonfinite_and_checks_shapes() -> None:
    """NaN/inf positions of x are skipped; mismatched shapes and empty input raise."""
    e = lowbit.error([1.0, np.nan, 2.0], [1.0, 5.0, 2.0])
    assert e["mse"] == 0.0
    with pytest.raises(LowbitError, match="shapes differ"):
        lowbit.error([1.0, 2.0], [1.0])
    with pytest.raises(LowbitError, match="empty"):
        lowbit.error([], [])


@pytest.mark.torch
def test_error_accepts_torch(rng: np.random.Generator) -> None:
    """Torch tensors (and QuantizedTensors made from them) are measured the same way."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal(256).astype(np.float32)
    qt = lowbit.quantize(torch.from_numpy(x), "int8")
    assert lowbit.error(torch.from_numpy(x), qt) == lowbit.error(x, lowbit.quantize(x, "int8"))
