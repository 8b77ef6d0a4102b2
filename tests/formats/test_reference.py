"""The exact reference (lowbit.formats.reference) against hand-worked cases and the formats' own
declarations. Everything else is tested against this module, so it is pinned here by
examples worked out on paper from the specifications."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings

import lowbit
from lowbit import CodeRangeError, LowbitError, NaNPolicyError
from lowbit.formats import reference as ref
from strategies import CATALOG_FLOATS, float_layouts

E4M3 = lowbit.format("float8_e4m3fn")
E5M2 = lowbit.format("float8_e5m2")
E2M1 = lowbit.format("float4_e2m1fn")
E8M0 = lowbit.format("float8_e8m0fnu")
FNUZ = lowbit.format("float8_e4m3fnuz")


def _small_catalog_floats() -> list[str]:
    return [n for n in CATALOG_FLOATS if lowbit.format(n).bits <= 16]


# ---- decode ---------------------------------------------------------------------------


def _check_declaration(fmt: lowbit.FloatFormat) -> None:
    maxc = ref.max_magnitude_code(fmt)
    assert maxc == fmt.max_code_magnitude
    assert ref.value_of_magnitude(fmt, maxc) == Fraction(fmt.max)
    mb = fmt.ebits + fmt.mbits
    codes = range(1 << fmt.bits) if fmt.bits <= 9 else range(0, 1 << fmt.bits, 7)
    for c in codes:
        kind = ref.special(fmt, c)
        assert (kind == "nan") == fmt.is_nan_code(c)
        mag = c & ((1 << mb) - 1)
        assert (kind == "inf") == (fmt.inf_code is not None and mag == fmt.inf_code)
        if kind is None:
            assert mag <= maxc
            assert ref.value_of_magnitude(fmt, mag) == fmt.exact_magnitude(mag)
    if fmt.has_nan:
        assert ref.canonical(fmt, fmt.nan_code) == fmt.nan_code
        assert ref.special(fmt, fmt.nan_code) == "nan"


@pytest.mark.parametrize("name", _small_catalog_floats())
def test_reference_agrees_with_declared_specials(name: str) -> None:
    """The reference derives the same NaN/inf codes, largest code and values as the format."""
    _check_declaration(lowbit.format(name))


@settings(max_examples=100, deadline=None)
@given(fmt=float_layouts(max_bits=12))
def test_reference_agrees_with_declared_specials_custom(fmt: lowbit.FloatFormat) -> None:
    """The same for random custom layouts."""
    _check_declaration(fmt)


def test_magnitudes_are_strictly_increasing() -> None:
    """Magnitude codes 0..maxc+1 have strictly increasing values (what the search relies on)."""
    for name in _small_catalog_floats():
        fmt = lowbit.format(name)
        vals = [ref.value_of_magnitude(fmt, k) for k in range(ref.max_magnitude_code(fmt) + 2)]
        assert all(a < b for a, b in itertools.pairwise(vals)), name


@pytest.mark.parametrize(
    ("name", "code", "expected"),
    [
        # OCP OFP8 v1.0 table 1 (E4M3): max S.1111.110 = 448, min normal 2^-6, min sub 2^-9
        ("float8_e4m3fn", 0x7E, Fraction(448)),
        ("float8_e4m3fn", 0x08, Fraction(1, 64)),
        ("float8_e4m3fn", 0x01, Fraction(1, 512)),
        ("float8_e4m3fn", 0xFE, Fraction(-448)),
        ("float8_e4m3fn", 0x7F, math.nan),
        ("float8_e4m3fn", 0xFF, math.nan),
        # E5M2: IEEE-like, inf at S.11111.00, max 57344 = S.11110.11
        ("float8_e5m2", 0x7B, Fraction(57344)),
        ("float8_e5m2", 0x7C, math.inf),
        ("float8_e5m2", 0xFC, -math.inf),
        ("float8_e5m2", 0x7D, math.nan),
        ("float8_e5m2", 0x01, Fraction(1, 2**16)),
        # fnuz: bias 8 (E4M3) / 16 (E5M2); 0x80 is the only NaN
        ("float8_e4m3fnuz", 0x7F, Fraction(240)),
        ("float8_e4m3fnuz", 0x80, math.nan),
        ("float8_e4m3fnuz", 0x01, Fraction(1, 2**10)),
        ("float8_e5m2fnuz", 0x7F, Fraction(57344)),
        ("float8_e5m2fnuz", 0x01, Fraction(1, 2**17)),
        # OCP MX v1.0: E2M1 values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; E8M0 2^(e-127), NaN 0xFF
        ("float4_e2m1fn", 0x1, Fraction(1, 2)),
        ("float4_e2m1fn", 0x7, Fraction(6)),
        ("float4_e2m1fn", 0xF, Fraction(-6)),
        ("float6_e2m3fn", 0x1F, Fraction(15, 2)),
        ("float6_e3m2fn", 0x1F, Fraction(28)),
        ("float8_e8m0fnu", 0x00, Fraction(1, 2**127)),
        ("float8_e8m0fnu", 0x7F, Fraction(1)),
        ("float8_e8m0fnu", 0xFE, Fraction(2**127)),
        ("float8_e8m0fnu", 0xFF, math.nan),
        # IEEE 754-2019 binary16: max 65504, min subnormal 2^-24, -0 = 0x8000
        ("float16", 0x7BFF, Fraction(65504)),
        ("float16", 0x0001, Fraction(1, 2**24)),
        ("float16", 0x7C00, math.inf),
        ("bfloat16", 0x7F7F, Fraction(0xFF) * 2**120),
    ],
)
def test_decode_golden_codes(name: str, code: int, expected: Fraction | float) -> None:
    """Codes worked out from the specifications decode to the stated values."""
    got = ref.decode(lowbit.format(name), code)
    if isinstance(expected, float) and math.isnan(expected):
        assert isinstance(got, float) and math.isnan(got)
    else:
        assert got == expected


def test_signed_zeros_and_nan_signs() -> None:
    """-0 decodes with its sign; a NaN decodes with its code's sign bit; fnuz has no -0."""
    f16 = lowbit.format("float16")
    assert math.copysign(1.0, ref.decode_float64(f16, 0x8000)) == -1.0
    assert ref.decode_float64(f16, 0x0000) == 0.0
    assert math.copysign(1.0, ref.decode_float64(f16, 0x0000)) == 1.0
    assert math.copysign(1.0, ref.decode_float64(E4M3, 0xFF)) == -1.0
    assert math.copysign(1.0, ref.decode_float64(E4M3, 0x7F)) == 1.0
    assert math.isnan(ref.decode_float64(FNUZ, 0x80))
    assert ref.is_negative(E4M3, 0x80) and ref.decode(E4M3, 0x80) == 0


def test_canonical_codes() -> None:
    """Every NaN code's canonical form is the quiet NaN with the same sign."""
    assert ref.canonical(E5M2, 0x7D) == 0x7E
    assert ref.canonical(E5M2, 0xFF) == 0xFE
    assert ref.canonical(E4M3, 0xFF) == 0xFF
    assert ref.canonical(FNUZ, 0x80) == 0x80
    assert ref.canonical(lowbit.format("float16"), 0xFC01) == 0xFE00
    assert ref.canonical(E2M1, 0x8) == 0x8  # -0 is its own code


def test_code_out_of_range() -> None:
    """Codes outside the format's width are refused."""
    with pytest.raises(CodeRangeError):
        ref.decode(E4M3, 256)
    with pytest.raises(CodeRangeError):
        ref.decode(E2M1, -1)
    with pytest.raises(CodeRangeError):
        ref.decode(lowbit.format("ternary"), 3)


# ---- encode: floats -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "x", "rounding", "saturate", "expected"),
    [
        # single rounding from float64: 1.0625 + 2^-40 is above the 1.0/1.125 midpoint
        ("float8_e4m3fn", 1.0625 + 2**-40, "nearest_even", False, 0x39),
        ("float8_e4m3fn", 1.0625, "nearest_even", False, 0x38),  # tie -> even (1.0)
        ("float8_e4m3fn", 1.0625, "nearest_away", False, 0x39),
        # E4M3 overflow (OFP8 §4: non-SAT -> NaN): 448 = 1.110b * 2^8, next would be 480
        ("float8_e4m3fn", 464.0, "nearest_even", False, 0x7E),  # tie -> even mantissa 110
        ("float8_e4m3fn", 464.0, "nearest_away", False, 0x7F),
        ("float8_e4m3fn", 465.0, "nearest_even", False, 0x7F),
        ("float8_e4m3fn", -465.0, "nearest_even", False, 0xFF),
        ("float8_e4m3fn", 465.0, "nearest_even", True, 0x7E),
        ("float8_e4m3fn", math.inf, "nearest_even", True, 0x7E),
        ("float8_e4m3fn", math.inf, "toward_zero", False, 0x7F),  # inf is exact: stays "inf"
        ("float8_e4m3fn", 1e9, "toward_zero", False, 0x7E),  # IEEE 754 §7.4
        ("float8_e4m3fn", -1e9, "toward_positive", False, 0xFE),
        ("float8_e4m3fn", -1e9, "toward_negative", False, 0xFF),
        # E5M2: 57344 = 1.11b * 2^15, odd mantissa: the tie 61440 overflows to inf
        ("float8_e5m2", 61440.0, "nearest_even", False, 0x7C),
        ("float8_e5m2", math.nextafter(61440.0, 0), "nearest_even", False, 0x7B),
        ("float8_e5m2", -61440.0, "nearest_even", False, 0xFC),
        ("float8_e5m2", 61440.0, "toward_negative", False, 0x7B),
        ("float8_e5m2", math.nan, "nearest_even", False, 0x7E),
        ("float8_e5m2", -math.nan, "nearest_even", False, 0xFE),
        # E2M1 (OCP MX v1.0): no inf or NaN, so overflow gives ±6 even without saturate
        ("float4_e2m1fn", 0.25, "nearest_even", False, 0x0),
        ("float4_e2m1fn", 0.75, "nearest_even", False, 0x2),
        ("float4_e2m1fn", 5.0, "nearest_even", False, 0x6),
        ("float4_e2m1fn", 7.0, "nearest_even", False, 0x7),
        ("float4_e2m1fn", -100.0, "nearest_even", False, 0xF),
        ("float4_e2m1fn", -0.0, "nearest_even", False, 0x8),
        ("float4_e2m1fn", -0.2, "nearest_even", False, 0x8),
        ("float4_e2m1fn", 1.1, "toward_zero", False, 0x2),
        ("float4_e2m1fn", 1.1, "toward_positive", False, 0x3),
        ("float4_e2m1fn", -1.1, "toward_positive", False, 0xA),
        ("float4_e2m1fn", -1.1, "toward_negative", False, 0xB),
        # fnuz: -0 and negatives rounding to zero give +0; overflow and inf give 0x80
        ("float8_e4m3fnuz", -0.0, "nearest_even", False, 0x00),
        ("float8_e4m3fnuz", -1e-10, "nearest_even", False, 0x00),
        ("float8_e4m3fnuz", 1e6, "nearest_even", False, 0x80),
        ("float8_e4m3fnuz", -math.inf, "nearest_even", True, 0xFF),
        # E8M0: powers of two; with no mantissa bit both tie candidates are odd and the
        # larger wins (IEEE 754 one-digit rule; ml_dtypes and torch agree)
        ("float8_e8m0fnu", 1.5, "nearest_even", False, 0x80),
        ("float8_e8m0fnu", 3.0, "nearest_even", False, 0x81),
        ("float8_e8m0fnu", 0.75, "nearest_even", False, 0x7F),
        ("float8_e8m0fnu", 1.4999, "nearest_even", False, 0x7F),
        ("float8_e8m0fnu", 2.0**-128, "nearest_even", False, 0x00),
        ("float8_e8m0fnu", 0.0, "nearest_even", False, 0x00),
        ("float8_e8m0fnu", 0.0, "toward_zero", False, 0x00),
        ("float8_e8m0fnu", -0.0, "nearest_even", False, 0x00),
        ("float8_e8m0fnu", -1.0, "nearest_even", False, 0xFF),
        ("float8_e8m0fnu", -1e-300, "nearest_even", False, 0xFF),
        ("float8_e8m0fnu", -1.0, "nearest_even", True, 0x00),
        ("float8_e8m0fnu", 1.4 * 2.0**-127, "nearest_even", False, 0x00),
        ("float8_e8m0fnu", 1.5 * 2.0**-127, "nearest_even", False, 0x01),
        ("float8_e8m0fnu", 2.0**127 * 1.5, "nearest_even", False, 0xFF),
        ("float8_e8m0fnu", 2.0**127 * 1.5, "nearest_even", True, 0xFE),
        ("float8_e8m0fnu", 2.0**127 * 1.9, "toward_zero", False, 0xFE),
    ],
)
def test_encode_golden(name: str, x: float, rounding: str, saturate: bool, expected: int) -> None:
    """Cases worked out by hand from IEEE 754-2019 §4.3/§7.4 and the OCP rules."""
    assert ref.encode(lowbit.format(name), x, rounding, saturate) == expected


def test_stochastic_threshold_is_exact() -> None:
    """Stochastic rounding goes up iff random_bits < r * 2**64, to the last unit."""
    # 1.25 is halfway between 1.0 and 1.5 in E2M1: r = 1/2
    assert ref.encode(E2M1, 1.25, "stochastic", random_bits=2**63 - 1) == 0x3
    assert ref.encode(E2M1, 1.25, "stochastic", random_bits=2**63) == 0x2
    # magnitudes: -1.25 rounds away from zero with the same bits
    assert ref.encode(E2M1, -1.25, "stochastic", random_bits=2**63 - 1) == 0xB
    # a value far below the first gap: r = 2^-1000 / 2^-9, threshold ceil(r * 2^64) = 1
    assert ref.encode(E4M3, 2.0**-1000, "stochastic", random_bits=0) == 0x01
    assert ref.encode(E4M3, 2.0**-1000, "stochastic", random_bits=1) == 0x00
    # exact values never move
    assert ref.encode(E4M3, 1.0, "stochastic", random_bits=0) == 0x38
    # past max, the upper neighbour is the overflow: 452 = 448 + 1/8 of the 32 gap
    assert ref.encode(E4M3, 452.0, "stochastic", random_bits=2**61 - 1) == 0x7F
    assert ref.encode(E4M3, 452.0, "stochastic", random_bits=2**61) == 0x7E
    assert ref.encode(E4M3, 452.0, "stochastic", saturate=True, random_bits=0) == 0x7E


def test_encode_errors() -> None:
    """NaN without a NaN code, bad modes and missing random bits are refused."""
    with pytest.raises(NaNPolicyError):
        ref.encode(E2M1, math.nan)
    assert ref.encode(E2M1, math.nan, nan="zero") == 0
    with pytest.raises(LowbitError):
        ref.encode(E2M1, 1.0, "stochastic")
    with pytest.raises(LowbitError):
        ref.encode(E2M1, 1.0, "sideways")
    with pytest.raises(LowbitError):
        ref.encode(E2M1, 1.0, nan="ignore")
    unsigned = lowbit.FloatFormat(name="u", ebits=3, mbits=2, signed=False, inf="none", nan="none")
    with pytest.raises(LowbitError):
        ref.encode(unsigned, -1.0)
    assert ref.encode(unsigned, -1.0, saturate=True) == 0


# ---- encode: integers and value sets ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "x", "rounding", "saturate", "expected"),
    [
        ("int4", 2.5, "nearest_even", None, 2),
        ("int4", 3.5, "nearest_even", None, 4),
        ("int4", -2.5, "nearest_even", None, 0b1110),  # -2
        ("int4", -2.5, "nearest_away", None, 0b1101),  # -3
        ("int4", -0.5, "nearest_even", None, 0),  # the article example: -0.5 -> 0, not -1
        ("int4", -2.7, "toward_zero", None, 0b1110),
        ("int4", -2.2, "toward_negative", None, 0b1101),
        ("int4", 2.2, "toward_positive", None, 3),
        ("int4", 9.0, "nearest_even", None, 7),
        ("int4", -9.0, "nearest_even", None, 8),  # -8
        ("int4", 9.0, "nearest_even", False, 9),  # wraps: 9 mod 16 = 0b1001 (-7)
        ("int4", -9.7, "toward_zero", False, 7),  # -9 mod 16 (ml_dtypes' cast)
        ("uint4", -1.0, "nearest_even", None, 0),
        ("uint4", 20.0, "nearest_even", False, 4),
        ("uint2", math.inf, "nearest_even", None, 3),
        ("int8", -128.4, "nearest_even", None, 0x80),
    ],
)
def test_int_golden(
    name: str, x: float, rounding: str, saturate: bool | None, expected: int
) -> None:
    """Integer rounding, saturation (default) and wrapping (saturate=False)."""
    assert ref.encode(lowbit.format(name), x, rounding, saturate) == expected


def test_int_stochastic_threshold() -> None:
    """SR on integers: away from zero iff random_bits < frac(|x|) * 2**64."""
    int8 = lowbit.format("int8")
    assert ref.encode(int8, 2.25, "stochastic", random_bits=2**62 - 1) == 3
    assert ref.encode(int8, 2.25, "stochastic", random_bits=2**62) == 2
    assert ref.encode(int8, -2.25, "stochastic", random_bits=2**62 - 1) == 0xFD  # -3
    assert ref.encode(int8, -2.25, "stochastic", random_bits=2**62) == 0xFE  # -2


def test_valueset_golden() -> None:
    """NF4 rounds to the nearest table entry; binary keeps x's sign toward zero."""
    nf4 = lowbit.format("nf4")
    assert ref.encode(nf4, 0.0) == 7
    assert ref.encode(nf4, 2.0) == 15
    assert ref.encode(nf4, -2.0) == 0
    assert ref.encode(nf4, 0.05) == 8  # nearer 0.0796 than 0
    assert ref.encode(nf4, 0.03) == 7
    mid = (0.07958029955625534 + 0.16093020141124725) / 2
    assert ref.encode(nf4, mid, "nearest_even") in (8, 9)
    assert ref.encode(nf4, math.nextafter(mid, 0)) == 8
    assert ref.encode(nf4, math.nextafter(mid, 1)) == 9
    assert ref.encode(nf4, 0.1, "toward_zero") == 8
    assert ref.encode(nf4, -0.1, "toward_zero") == 6
    binary = lowbit.format("binary")
    assert ref.encode(binary, 0.3, "toward_zero") == 1
    assert ref.encode(binary, -0.3, "toward_zero") == 0
    assert ref.encode(binary, 0.0, "nearest_even") == 0  # a tie: the even code, -1
    assert ref.encode(binary, 0.0, "nearest_away") == 1
    ternary = lowbit.format("ternary")
    assert ref.encode(ternary, 0.5) == 2  # a tie between codes 1 and 2: the even code
    assert ref.encode(ternary, -0.5) == 0
