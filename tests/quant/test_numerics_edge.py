"""Range edges of quantization: scales that overflow their format raise, tensors whose scales
underflow to all zeros warn (issue 11, case 9)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import lowbit
from lowbit import LowbitError
from lowbit.codecs import _numba as _fast
from lowbit.errors import UnderflowError, UnderflowWarning
from lowbit.formats.catalog import mx_format

MX = ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8"]

# ---- scale overflow ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["int4", "nf4", "fp8_e4m3", "mxfp4", "mxint8"])
def test_1e300_raises_in_every_format(fmt: str) -> None:
    """float64 1e300 next to 1.0: a LowbitError in MX formats too (mxfp4 used to saturate it
    to 1.02e39 and flush the 1.0 to zero without a word)."""
    x = np.array([1e300, 1.0] + [0.5] * 30)
    with pytest.raises(LowbitError, match="a scale overflows"):
        lowbit.quantize(x, fmt)


@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("kernels", [True, False])
def test_mx_scale_overflow_threshold(fmt: str, kernels: bool) -> None:
    """A block holds up to, not including, 2**(128 + emax_elem): the shared exponent
    floor(log2 amax) - emax_elem must fit E8M0's 2**127 (OCP MX v1.0 §6.3); the numba
    kernels and the numpy path agree."""
    mxf = mx_format(fmt)
    limit = math.ldexp(1.0, 128 + mxf.emax_elem)
    below = np.array([np.nextafter(limit, 0.0), 1.0] + [0.0] * 30)
    at = below.copy()
    at[0] = limit
    with _fast.numpy_only() if not kernels else _fast.kernels_always():
        qt = lowbit.quantize(below, fmt)
        # the largest E8M0 scale, 2**127 (MXINT8 stores X * 2**-6)
        assert float(qt.scale[0]) == math.ldexp(1.0, 127 - mxf.int_shift)
        with pytest.raises(LowbitError, match=r"overflows float8_e8m0fnu.*2\*\*127"):
            lowbit.quantize(at, fmt)
        with pytest.raises(LowbitError, match="overflows"):
            lowbit.quantize(-at, fmt)  # the sign does not matter


@pytest.mark.parametrize("fmt", MX)
def test_float32_data_never_overflows_mx(fmt: str) -> None:
    """Every float32 value fits an MX block (2**128 > float32's max): float32's largest
    magnitudes quantize, and the block's largest element keeps its sign and binade."""
    big = np.finfo(np.float32).max
    x = np.array([big, -big / 3, 1.0, 0.0] * 8, dtype=np.float32)
    qt = lowbit.quantize(x, fmt)
    back = qt.dequantize(np.float64)
    assert back[0] > 0 and back[1] < 0 and np.isfinite(back).all()
    assert math.frexp(back[0])[1] >= math.frexp(float(big))[1] - 1


@pytest.mark.parametrize(
    ("scale_format", "fits", "overflows"),
    [
        # int4 scale = amax / 7: 65519 rounds down to float16's 65504, 65520 is past it
        ("float16", 65519.0 * 7, 65520.0 * 7),
        ("bfloat16", 3.38e38 * 7, 1e300),
        ("e8m0", 2.0**127 * 7, 2.0**128 * 7),
        ("float32", 3.4e38 * 7, 3.41e38 * 7),
    ],
)
def test_scale_format_overflow_raises(scale_format: str, fits: float, overflows: float) -> None:
    """A scale beyond its scale format's range is an error (float16 scales used to saturate
    at 65504, so int4 of 1e6 came back as 458528)."""
    qt = lowbit.quantize(np.array([fits, 1.0]), "int4", scale_format=scale_format)
    assert np.isfinite(qt.scale).all() and qt.unpack()[0] == 7
    with pytest.raises(LowbitError, match="a scale overflows"):
        lowbit.quantize(np.array([overflows, 1.0]), "int4", scale_format=scale_format)


def test_normal_data_keeps_its_bytes() -> None:
    """The overflow checks change nothing below the limits: codes and scales equal the
    ones an explicit E8M0 computation gives (tests/test_golden.py pins the rest)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 64)) * 10.0 ** rng.integers(-30, 30, (8, 1))).astype(np.float32)
    qt = lowbit.quantize(x, "mxfp4")
    amax = np.abs(x.astype(np.float64)).reshape(8, 2, 32).max(-1)
    want = np.ldexp(1.0, np.floor(np.log2(amax)).astype(int) - 2)
    np.testing.assert_array_equal(qt.scale.astype(np.float64), want)


# ---- underflow to all zeros --------------------------------------------------------


@pytest.mark.parametrize("fmt", ["int4", "int8", "nf4", "fp8_e4m3", "mxfp4", "mxint8"])
def test_all_zero_result_warns(fmt: str) -> None:
    """float64 values of 1e-300 quantize to all zeros (the scales stop at their format's
    smallest value): an UnderflowWarning, pointing at the caller, names what happened."""
    x = np.array([1e-300, -2e-300, 0.0, 3e-300])
    with pytest.warns(UnderflowWarning, match=r"all 4 values quantized to zero though 3") as rec:
        qt = lowbit.quantize(x, fmt)
    assert rec[0].filename == __file__
    assert issubclass(UnderflowWarning, UserWarning)
    assert not np.any(qt.dequantize(np.float64))  # the warning is true


def test_underflow_policies() -> None:
    """underflow='raise' makes it an UnderflowError (a LowbitError); 'ignore' is silent and
    gives the same codes; an unknown policy is refused."""
    x = np.array([1e-300, 2e-300])
    with pytest.raises(UnderflowError, match="quantized to zero"):
        lowbit.quantize(x, "int4", underflow="raise")
    assert issubclass(UnderflowError, LowbitError)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = lowbit.quantize(x, "int4", underflow="ignore")
    with pytest.warns(UnderflowWarning):
        loud = lowbit.quantize(x, "int4")
    assert quiet.codes.tobytes() == loud.codes.tobytes()
    with pytest.raises(LowbitError, match="underflow policy"):
        lowbit.quantize(x, "int4", underflow="loud")


@pytest.mark.parametrize(
    ("x", "kw"),
    [
        (np.zeros(64), {"fmt": "int4"}),  # nothing to lose
        (np.zeros(64), {"fmt": "mxfp4"}),  # zero blocks sit at E8M0's smallest scale
        (np.array([127.0, 1.0]), {"fmt": "int8"}),  # scale exactly 1
        # one group underflows, the other does not: not the whole tensor
        (np.array([1e-300, 2e-300, 1.0, 2.0]), {"fmt": "int4", "group_size": 2}),
        (np.array([1e-300, -1e-300]), {"fmt": "ternary"}),  # codes ±1: values 1.4e-45
        (np.array([1e-40, 2e-40], np.float32), {"fmt": "int8"}),  # subnormal scale, not 0
    ],
)
def test_no_warning_without_underflow(x: np.ndarray, kw: dict) -> None:
    """All-zero input, a scale that is 1 by coincidence, a tensor that keeps some nonzero
    value: no warning (pytest turns one into an error)."""
    fmt = kw.pop("fmt")
    qt = lowbit.quantize(x, fmt, **kw)
    assert np.any(qt.dequantize(np.float64)) == bool(np.any(x))


def test_nan_propagation_is_not_underflow() -> None:
    """NaN kept by nan='propagate' next to tiny values: the result is not all zeros."""
    x = np.array([np.nan, 1e-300, 2e-300])
    qt = lowbit.quantize(x, "int4", nan="propagate")
    assert np.isnan(qt.dequantize(np.float64)).all()
