"""ValueSetFormat: NF4 as QLoRA publishes it, every code and every midpoint against the exact
reference, stochastic rounding checked exactly."""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit import CodeRangeError, LowbitError, NaNPolicyError, ValueSetFormat
from lowbit.formats import reference as ref
from strategies import CATALOG_VALUESETS, DETERMINISTIC, ROUNDINGS, any_float64, random_bits

# QLoRA (Dettmers et al. 2023, arXiv 2305.14314) NF4, as the float32 values bitsandbytes
# ships (functional.py, get_4bit_type("nf4")), code index order; REFERENCE.md §3.
NF4_PUBLISHED = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]  # fmt: skip

CUSTOM = [
    ValueSetFormat(name="c_wide", table=(-1e-17, 1.0, 3.0, 1e10)),  # float64 distances round
    ValueSetFormat(name="c_asym", table=(-3.0, -0.5, 0.25, 0.75, 2.0)),  # 3 bits, 5 codes
]
ALL = [lowbit.format(n) for n in CATALOG_VALUESETS] + CUSTOM
IDS = [f.name for f in ALL]


def test_nf4_is_the_published_table() -> None:
    """NF4 decodes to the 16 published values, bit for bit, in code order."""
    nf4 = lowbit.format("nf4")
    got = nf4.decode(np.arange(16), dtype=np.float64)
    assert got.tolist() == NF4_PUBLISHED
    assert nf4.decode(np.arange(16)).tolist() == np.float32(NF4_PUBLISHED).tolist()
    assert (nf4.bits, nf4.finite_count, nf4.max, nf4.min) == (4, 16, 1.0, -1.0)


def test_nf4_rederived_from_normal_quantiles() -> None:
    """NF4 = normal quantiles at 8 evenly spaced probabilities from 0.9677083 to 1/2 (positive
    side) and 7 (negative side), plus 0, divided by the largest (QLoRA §3, Appendix E)."""
    offset, nd = 0.9677083, NormalDist()

    def probs(n: int) -> list[float]:  # linspace(offset, 0.5, n) without its last point
        return [offset + (0.5 - offset) * i / (n - 1) for i in range(n - 1)]

    values = sorted([nd.inv_cdf(p) for p in probs(9)] + [0.0] + [-nd.inv_cdf(p) for p in probs(8)])
    values = [v / values[-1] for v in values]
    np.testing.assert_allclose(values, NF4_PUBLISHED, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_decode_and_roundtrip(fmt: ValueSetFormat) -> None:
    """Every code decodes to its table entry and encodes back to itself in every mode."""
    codes = np.arange(len(fmt.table))
    vals = np.array([float(ref.decode(fmt, int(c))) for c in codes])
    np.testing.assert_array_equal(fmt.decode(codes, dtype=np.float64), vals)
    rb = np.random.default_rng(0).integers(0, 2**64, codes.size, dtype=np.uint64)
    for mode in ROUNDINGS:
        assert fmt.encode(vals, rounding=mode, random_bits=rb).tolist() == codes.tolist()


def _neighbour_inputs(fmt: ValueSetFormat) -> np.ndarray:
    t = np.array(fmt.table)
    a, b = t[:-1], t[1:]
    mid = a / 2 + b / 2
    pts = [a, b, mid, np.nextafter(mid, -np.inf), np.nextafter(mid, np.inf), a + (b - a) / 3]
    ends = [t[0] - 1, t[-1] + 1, -np.inf, np.inf, 0.0, -0.0, 5e-324, -5e-324]
    return np.concatenate([*pts, ends])


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_neighbours_match_reference(fmt: ValueSetFormat) -> None:
    """Entries, midpoints and the float64 either side, beyond the ends: every deterministic
    mode against the reference (ties: even code / larger magnitude; ends saturate)."""
    x = _neighbour_inputs(fmt)
    for mode in DETERMINISTIC:
        got = fmt.encode(x, rounding=mode).tolist()
        assert got == [ref.encode(fmt, float(v), mode) for v in x], mode


def test_nearest_is_exact_where_float64_distances_round() -> None:
    """0.5 is nearer 1.0 than -1e-17 (the rounded distances would call it a tie)."""
    fmt = CUSTOM[0]
    assert fmt.encode([0.5, -0.5 + 1e-17 / 2], rounding="nearest_even").tolist() == [1, 0]
    assert fmt.encode([0.5], rounding="nearest_away").tolist() == [1]


def test_toward_zero_keeps_the_sign_without_zero() -> None:
    """binary = {-1, +1}: toward_zero gives sign(x); ties at 0 follow the tie rule."""
    binary = lowbit.format("binary")
    x = [0.3, -0.3, 5.0, -5.0]
    assert binary.decode(binary.encode(x, rounding="toward_zero")).tolist() == [1, -1, 1, -1]
    assert binary.encode([0.0], rounding="nearest_even").tolist() == [0]
    assert binary.encode([0.0], rounding="nearest_away").tolist() == [1]


@pytest.mark.parametrize("name", ["ternary", "binary"])
def test_stochastic_probability_is_exact(name: str) -> None:
    """On a dyadic table, at j/16 of a gap exactly j of 16 top-4-bit patterns round up."""
    fmt = lowbit.format(name)
    k = np.arange(16, dtype=np.uint64)
    rng = np.random.default_rng(5)
    t = fmt.table
    for i in range(len(t) - 1):
        for j in range(16):
            x = t[i] + j * (t[i + 1] - t[i]) / 16
            rb = (k << np.uint64(60)) | rng.integers(0, 2**60, 16, dtype=np.uint64)
            got = fmt.encode(np.full(16, x), rounding="stochastic", random_bits=rb)
            assert int((got == i + 1).sum()) == j and set(got.tolist()) <= {i, i + 1}


def test_stochastic_threshold_is_exact_for_nf4() -> None:
    """Between two NF4 entries the threshold ceil(r * 2**64) is exact to the last bit."""
    nf4 = lowbit.format("nf4")
    for i in range(15):
        a, b = nf4.table[i], nf4.table[i + 1]
        for x in (a + (b - a) / 3, a + (b - a) * 0.999, math.nextafter(a, b)):
            r = (Fraction(x) - Fraction(a)) / (Fraction(b) - Fraction(a))
            t = math.ceil(r * 2**64)
            rb = np.array([t - 1, t], dtype=np.uint64)
            got = nf4.encode([x, x], rounding="stochastic", random_bits=rb).tolist()
            assert got == [i + 1, i], (i, x)


def test_stochastic_mean_is_unbiased() -> None:
    """Seeded SR into NF4 has mean error within 5 standard errors of zero."""
    nf4 = lowbit.format("nf4")
    x = np.random.default_rng(6).uniform(-1, 1, 1 << 18)
    err = nf4.decode(nf4.encode(x, rounding="stochastic", seed=3), dtype=np.float64) - x
    assert abs(err.mean()) < 5 * err.std() / math.sqrt(x.size)


@settings(max_examples=200, deadline=None)
@given(
    fmt=st.sampled_from(ALL),
    xs=st.lists(st.one_of(any_float64, st.floats(-2, 2)), min_size=1, max_size=10),
    mode=st.sampled_from(ROUNDINGS),
    bits=st.lists(random_bits, min_size=10, max_size=10),
)
def test_codec_matches_reference(fmt, xs, mode, bits) -> None:
    """Any float64, any mode: the codec is the reference."""
    xs = [v for v in xs if not math.isnan(v)]
    rb = np.array(bits[: len(xs)], dtype=np.uint64)
    got = fmt.encode(np.array(xs), rounding=mode, random_bits=rb).tolist()
    assert got == [ref.encode(fmt, v, mode, None, int(b)) for v, b in zip(xs, rb, strict=True)]


def test_nan_and_bad_input() -> None:
    """NaN raises unless nan='zero'; codes past the table and bad tables are refused."""
    nf4 = lowbit.format("nf4")
    with pytest.raises(NaNPolicyError):
        nf4.encode([math.nan])
    assert nf4.encode([math.nan], nan="zero").tolist() == [7]
    ternary = lowbit.format("ternary")
    assert ternary.bits == 2
    with pytest.raises(CodeRangeError, match="3"):
        ternary.decode([0, 3])
    with pytest.raises(LowbitError, match="integer"):
        nf4.decode([0.5])
    for table in [(1.0, 0.5), (0.0,), (0.0, math.inf), (0.0, 0.0, 1.0)]:
        with pytest.raises(LowbitError, match="increasing"):
            ValueSetFormat(name="bad", table=table)
