"""IntFormat: every code of every integer format of 16 bits or fewer against the exact
reference; rounding at every half-integer; saturation and wrapping; stochastic rounding
checked exactly."""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit import CodeRangeError, IntFormat, LowbitError, NaNPolicyError
from lowbit.formats import reference as ref
from strategies import (
    CATALOG_INTS,
    DETERMINISTIC,
    ROUNDINGS,
    any_float64,
    random_bits,
    reference_values,
)

SMALL = [lowbit.format(n) for n in CATALOG_INTS if lowbit.format(n).bits <= 16]
IDS = [f.name for f in SMALL]


@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
def test_decode_every_code(fmt: IntFormat) -> None:
    """Every code decodes to its two's complement (or unsigned) value, in any dtype."""
    codes = np.arange(1 << fmt.bits)
    want = reference_values(fmt)
    np.testing.assert_array_equal(fmt.decode(codes, dtype=np.float64), want)
    np.testing.assert_array_equal(fmt.decode(codes, dtype=np.int64), want.astype(np.int64))
    np.testing.assert_array_equal(fmt.to_signed(codes), want)
    assert fmt.values().tolist() == sorted(want.tolist())
    assert (fmt.min, fmt.max) == (want.min(), want.max())
    assert fmt.finite_count == want.size


@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
def test_encode_decode_is_identity(fmt: IntFormat) -> None:
    """encode(decode(c)) == c in every mode, saturating or wrapping."""
    codes = np.arange(1 << fmt.bits)
    vals = reference_values(fmt)
    rb = np.random.default_rng(0).integers(0, 2**64, codes.size, dtype=np.uint64)
    for mode in ROUNDINGS:
        for saturate in (None, True, False):
            got = fmt.encode(vals, rounding=mode, saturate=saturate, random_bits=rb)
            assert got.dtype == fmt.code_dtype
            np.testing.assert_array_equal(got, codes)


@functools.cache
def _half_integer_cases(fmt: IntFormat) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Each integer n and n+1, the midpoint and the float64 either side of it, with the
    result of each deterministic mode derived directly from its definition."""
    n = np.arange(fmt.min, fmt.max, dtype=np.float64)
    mid = n + 0.5
    x = np.stack([n, n + 1, mid, np.nextafter(mid, -np.inf), np.nextafter(mid, np.inf)])
    lo, hi = np.floor(x), np.ceil(x)
    near, far = np.trunc(x), np.trunc(x) + np.sign(x)  # the neighbours nearer / farther from 0
    frac = np.abs(x - near)  # exact (x - floor(x) is not for x in (-1, 0))
    expected = {
        "nearest_even": np.where(
            (frac > 0.5) | ((frac == 0.5) & (np.mod(near, 2) == 1)), far, near
        ),
        "nearest_away": np.where(frac >= 0.5, far, near),
        "toward_zero": np.trunc(x),
        "toward_positive": hi,
        "toward_negative": lo,
    }
    codes = {m: np.mod(v, 2.0**fmt.bits).astype(np.int64).reshape(-1) for m, v in expected.items()}
    return x.reshape(-1), codes


@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
def test_half_integers_round_where_expected(fmt: IntFormat) -> None:
    """n, n+1, n+0.5 and its float64 neighbours round as each mode says, for every n."""
    x, expected = _half_integer_cases(fmt)
    for mode in DETERMINISTIC:
        for saturate in (None, False):
            got = fmt.encode(x, rounding=mode, saturate=saturate).astype(np.int64)
            np.testing.assert_array_equal(got, expected[mode], err_msg=mode)


@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
def test_half_integer_expectations_match_reference(fmt: IntFormat) -> None:
    """The expectations above are the reference's (all up to 8 bits, a sample above)."""
    x, expected = _half_integer_cases(fmt)
    idx = np.arange(x.size) if fmt.bits <= 8 else np.random.default_rng(1).choice(x.size, 300)
    for mode in DETERMINISTIC:
        for i in idx:
            assert ref.encode(fmt, float(x[i]), mode) == expected[mode][i]


EDGES = [
    127.5, 128.0, 128.5, 255.5, 256.0, 1000.7, 2.0**31 + 0.5, 2.0**53, 2.0**63, 1e300,
    math.inf, 0.0, -0.0, 0.4, -0.6, 1e-300,
]  # fmt: skip


@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
def test_out_of_range_saturates_or_wraps(fmt: IntFormat) -> None:
    """Beyond the range: saturate (default) clamps; saturate=False wraps modulo 2**bits
    (what a C cast does), every mode, against the reference."""
    x = np.array(EDGES + [-v for v in EDGES] + [fmt.max + 0.5, fmt.min - 0.5, fmt.max + 1])
    for mode in DETERMINISTIC:
        for saturate in (None, True, False):
            got = fmt.encode(x, rounding=mode, saturate=saturate).tolist()
            want = [ref.encode(fmt, float(v), mode, saturate) for v in x]
            assert got == want, (mode, saturate)
    assert fmt.encode([1e9, -1e9]).tolist() == [
        ref.encode(fmt, fmt.max),
        ref.encode(fmt, fmt.min),
    ]


def test_int4_wrap_is_ml_dtypes_cast() -> None:
    """toward_zero + saturate=False is ml_dtypes' int4 cast: 9 -> -7, -9.7 -> 7, 7.9 -> 7."""
    int4 = lowbit.format("int4")
    got = int4.decode(int4.encode([9.0, -9.7, 7.9, -8.5], rounding="toward_zero", saturate=False))
    assert got.tolist() == [-7.0, 7.0, 7.0, -8.0]


def test_nan_policy() -> None:
    """NaN raises unless nan='zero' (then code 0)."""
    int8 = lowbit.format("int8")
    with pytest.raises(NaNPolicyError):
        int8.encode([1.0, math.nan])
    assert int8.encode([1.0, math.nan], nan="zero").tolist() == [1, 0]


@pytest.mark.parametrize("name", ["int4", "uint4", "int8", "int16"])
def test_stochastic_probability_is_exact(name: str) -> None:
    """At j/16 past an integer (both signs), exactly j of the 16 top-4-bit patterns round
    away from zero, whatever the low 60 bits are."""
    fmt = lowbit.format(name)
    k = np.arange(16, dtype=np.uint64)
    rng = np.random.default_rng(2)
    for n in (0.0, 1.0, 2.0, 5.0):
        for sign in (1.0, -1.0) if fmt.signed else (1.0,):
            for j in range(16):
                x = sign * (n + j / 16)
                rb = (k << np.uint64(60)) | rng.integers(0, 2**60, 16, dtype=np.uint64)
                got = fmt.decode(fmt.encode(np.full(16, x), rounding="stochastic", random_bits=rb))
                assert set(got.tolist()) <= {sign * n + 0.0, sign * (n + 1)}
                assert int((np.abs(got) == n + 1).sum()) == j, (x, got)


def test_stochastic_threshold_and_mean() -> None:
    """The threshold is exact to the last random bit; the seeded mean is unbiased."""
    int8 = lowbit.format("int8")
    x = 2.0 + 1 / 3
    t = math.ceil(Fraction(x - 2) * 2**64)  # x - 2 is exact in float64
    rb = np.array([t - 1, t], dtype=np.uint64)
    assert int8.encode([x, x], rounding="stochastic", random_bits=rb).tolist() == [3, 2]
    rng = np.random.default_rng(4)
    xs = rng.uniform(-100, 100, 1 << 18)
    err = int8.decode(int8.encode(xs, rounding="stochastic", seed=9), dtype=np.float64) - xs
    assert abs(err.mean()) < 5 * err.std() / math.sqrt(xs.size)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(CATALOG_INTS),
    xs=st.lists(st.one_of(any_float64, st.floats(-300, 300)), min_size=1, max_size=10),
    mode=st.sampled_from(ROUNDINGS),
    saturate=st.sampled_from([None, True, False]),
    bits=st.lists(random_bits, min_size=10, max_size=10),
)
def test_codec_matches_reference(name, xs, mode, saturate, bits) -> None:
    """Any float64, any mode, saturating or wrapping: the codec is the reference."""
    fmt = lowbit.format(name)
    xs = [v for v in xs if not math.isnan(v)]
    rb = np.array(bits[: len(xs)], dtype=np.uint64)
    got = fmt.encode(np.array(xs), rounding=mode, saturate=saturate, random_bits=rb).tolist()
    want = [ref.encode(fmt, v, mode, saturate, int(b)) for v, b in zip(xs, rb, strict=True)]
    assert got == want


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from(CATALOG_INTS),
    xs=st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=10),
    mode=st.sampled_from(DETERMINISTIC),
)
def test_monotone_and_bounded(name, xs, mode) -> None:
    """Saturating rounding is monotone, within [min, max] and within 1 of x in range."""
    fmt = lowbit.format(name)
    x = np.sort(np.array(xs))
    r = fmt.decode(fmt.encode(x, rounding=mode), dtype=np.float64)
    assert (r[1:] >= r[:-1]).all()
    assert ((r >= fmt.min) & (r <= fmt.max)).all()
    inside = (x >= fmt.min) & (x <= fmt.max)
    assert (np.abs(r - x)[inside] <= (1.0 if mode.startswith("toward") else 0.5)).all()


def test_bad_codes() -> None:
    """Codes out of range and non-integer codes are refused."""
    int4 = lowbit.format("int4")
    with pytest.raises(CodeRangeError, match="16"):
        int4.decode([3, 16])
    with pytest.raises(CodeRangeError):
        int4.decode([-1])
    with pytest.raises(LowbitError, match="integer"):
        int4.decode(np.array([1.5]))
    with pytest.raises(LowbitError, match="numeric"):
        int4.encode(["x"])
    with pytest.raises(LowbitError):
        IntFormat(name="int1", nbits=1)


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from([n for n in CATALOG_INTS if lowbit.format(n).signed]),
    xs=st.lists(st.floats(-200, 200), min_size=1, max_size=10),
    mode=st.sampled_from(ROUNDINGS),
    bits=st.lists(random_bits, min_size=10, max_size=10),
)
def test_sign_symmetric(name, xs, mode, bits) -> None:
    """round(-x) = -round(x) within [-max, max] (stochastic: with the same random bits);
    toward_positive of -x is minus toward_negative of x."""
    fmt = lowbit.format(name)
    x = np.clip(np.array(xs), -fmt.max, fmt.max)
    rb = np.array(bits[: x.size], dtype=np.uint64)
    mirror = {"toward_positive": "toward_negative", "toward_negative": "toward_positive"}
    r = fmt.decode(fmt.encode(x, rounding=mode, random_bits=rb), dtype=np.float64)
    s = fmt.decode(fmt.encode(-x, rounding=mirror.get(mode, mode), random_bits=rb), np.float64)
    np.testing.assert_array_equal(s, -r)
