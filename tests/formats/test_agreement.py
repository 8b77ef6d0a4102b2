"""Bit-for-bit agreement with ml_dtypes, torch and gfloat, and the deliberate differences.

Each peer is compared in the mode that reproduces it (docs/formats.md, "Where peers
disagree"): ml_dtypes' casts are nearest-even and non-saturating; its integer casts
truncate (out of range: wrap before 0.7, 0 from 0.7); torch saturates float8_e4m3fn;
gfloat is called with the same mode and saturation. What a peer does differently on purpose is excluded from the bit-for-bit
comparison by an explicit mask and tested on its own against the exact reference.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import NaNPolicyError
from lowbit.formats import reference as ref
from strategies import CODEC_PATHS, codec_path

ML_FLOATS = [
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3",
    "float8_e3m4",
    "float8_e4m3b11fnuz",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
    "bfloat16",
    "float16",
]
ML_INTS = ["int2", "int4", "uint2", "uint4"]
F32_SUBNORMAL = 2.0**-126
#: ml_dtypes 0.7 changed three behaviours these tests document (docs/formats.md, "Where peers
#: disagree"): float64 is rounded once (0.6: through float32), float32 subnormal inputs reach
#: float8_e8m0fnu by value (0.6: on the bit fields), and an integer cast whose truncated value
#: is out of range gives 0 (0.6: wraps modulo 2^n). Each test asserts the installed version's.
ML_DTYPES_07 = tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2]) >= (0, 7)


def _as(x: np.ndarray, dtype: Any) -> np.ndarray:
    """``x.astype(dtype)`` without the warning signalling NaNs raise when they widen."""
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


def _f16_patterns() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def _bf16_patterns() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)


@functools.cache
def _random_f32(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint32).view(np.float32)


def _specials(fmt: lowbit.FloatFormat) -> np.ndarray:
    """Special values and the edges of ``fmt``'s range, as float32."""
    top = fmt.max
    nxt = float(ref.value_of_magnitude(fmt, ref.max_magnitude_code(fmt) + 1))
    f32 = np.finfo(np.float32)
    vals = [0.0, math.inf, math.nan, float(f32.max), float(f32.smallest_subnormal), 2.0**-126]
    vals += [top, (top + nxt) / 2, nxt, fmt.smallest_positive, fmt.smallest_positive / 2]
    vals += [fmt.smallest_normal, 1.0, 0.3952]
    x = np.array(vals + [-v for v in vals], dtype=np.float64)
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
        near = np.concatenate(
            [np.nextafter(x32, np.float32(np.inf)), np.nextafter(x32, np.float32(-np.inf))]
        )
    return np.concatenate([x32, near])


def _ml_codes(fmt: lowbit.Format, x: np.ndarray) -> np.ndarray:
    """ml_dtypes' (or numpy's) cast of ``x``, as codes (sub-byte types: the low bits)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if x.dtype.itemsize == 1:  # ml_dtypes casts between its 8-bit types through float32
            x = x.astype(np.float32)  # (exact; some pairs have no direct cast)
        y = x.astype(fmt.ml_dtype)
    codes = y.view(np.uint16 if y.itemsize == 2 else np.uint8)
    return codes & np.uint16((1 << fmt.bits) - 1) if fmt.bits < 8 else codes


def _same_codes(fmt: lowbit.Format, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Equal codes; NaN codes count as equal when their signs agree (payloads are not
    carried: lowbit writes the quiet NaN)."""
    same = got.astype(np.int64) == want.astype(np.int64)
    if isinstance(fmt, lowbit.FloatFormat) and fmt.has_nan:
        g = fmt.decode(got, dtype=np.float64)
        w = fmt.decode(want, dtype=np.float64)
        same |= np.isnan(g) & np.isnan(w) & (np.signbit(g) == np.signbit(w))
    return same


def _ml_known_differences(fmt: lowbit.FloatFormat, x: np.ndarray) -> np.ndarray:
    """Where lowbit differs from ml_dtypes on purpose (tested separately below)."""
    x64 = _as(x, np.float64)
    known = np.zeros(x.shape, dtype=bool)
    if not fmt.has_nan:  # ml_dtypes: a zero of the opposite sign; lowbit: raise or +0
        known |= np.isnan(x64)
    if fmt.name == "float8_e8m0fnu":
        # ml_dtypes: 0 -> NaN (lowbit: 0x00, as torch); before 0.7, float32 subnormal inputs
        # are rounded on their bit fields (lowbit and ml_dtypes 0.7: by value)
        known |= x64 == 0
        if not ML_DTYPES_07:
            known |= (np.abs(x64) < F32_SUBNORMAL) & (x64 > 0)
    return known


def _check_ml(fmt: lowbit.FloatFormat, x: np.ndarray, path: str) -> None:
    want = _ml_codes(fmt, x)
    with codec_path(path):
        got = fmt.encode(x, nan="zero")
    ok = _same_codes(fmt, got, want) | _ml_known_differences(fmt, x)
    assert ok.all(), (fmt.name, x[~ok][:5], got[~ok][:5], want[~ok][:5])


# ---- ml_dtypes: floats ------------------------------------------------------------------


@pytest.mark.parametrize("path", CODEC_PATHS)
@pytest.mark.parametrize("name", ML_FLOATS)
def test_ml_dtypes_all_16_bit_patterns(name: str, path: str) -> None:
    """All 2**16 float16 and all 2**16 bfloat16 patterns encode as ml_dtypes casts them."""
    fmt = lowbit.format(name)
    _check_ml(fmt, _f16_patterns(), path)
    _check_ml(fmt, _bf16_patterns(), path)


@pytest.mark.parametrize("path", CODEC_PATHS)
@pytest.mark.parametrize("name", ML_FLOATS)
def test_ml_dtypes_random_float32(name: str, path: str) -> None:
    """2**24 random float32 bit patterns (2**20 on the numpy path) encode as ml_dtypes does."""
    fmt = lowbit.format(name)
    n, chunk = (1 << 24, 1 << 22) if path == "default" else (1 << 20, 1 << 20)
    x = _random_f32(1 << 24, 0)[:n]
    for start in range(0, n, chunk):
        _check_ml(fmt, x[start : start + chunk], path)


@pytest.mark.parametrize("path", CODEC_PATHS)
@pytest.mark.parametrize("name", ML_FLOATS)
def test_ml_dtypes_special_values(name: str, path: str) -> None:
    """±0, ±inf, NaN, float32 extremes, the format's max and overflow threshold and their
    float32 neighbours encode as ml_dtypes casts them."""
    fmt = lowbit.format(name)
    _check_ml(fmt, _specials(fmt), path)


@pytest.mark.parametrize("path", CODEC_PATHS)
@pytest.mark.parametrize("src", [n for n in ML_FLOATS if lowbit.format(n).bits <= 8])
def test_ml_dtypes_every_code_into_every_format(src: str, path: str) -> None:
    """Every code of each 8-bit-or-narrower shared format, as its ml_dtypes array, decodes
    as ml_dtypes decodes it and converts into every shared format as ml_dtypes does."""
    sfmt = lowbit.format(src)
    x = np.arange(1 << sfmt.bits, dtype=np.uint8).view(sfmt.ml_dtype)
    with codec_path(path):
        mine = sfmt.decode(np.arange(1 << sfmt.bits), dtype=np.float32)
    theirs = _as(x, np.float32)
    nan = np.isnan(mine) & np.isnan(theirs) & (np.signbit(mine) == np.signbit(theirs))
    assert (nan | (mine.view(np.uint32) == theirs.view(np.uint32))).all()
    for dst in ML_FLOATS:
        _check_ml(lowbit.format(dst), x, path)


def test_ml_dtypes_decodes_16_bit_formats() -> None:
    """Every bfloat16 and float16 code decodes to ml_dtypes'/numpy's float32 (NaN: sign)."""
    for name, patterns in (("bfloat16", _bf16_patterns()), ("float16", _f16_patterns())):
        fmt = lowbit.format(name)
        mine = fmt.decode(np.arange(1 << 16))
        theirs = _as(patterns, np.float32)
        nan = np.isnan(mine) & np.isnan(theirs) & (np.signbit(mine) == np.signbit(theirs))
        assert (nan | (mine.view(np.uint32) == theirs.view(np.uint32))).all(), name


# ---- ml_dtypes: the deliberate differences ----------------------------------------------


@pytest.mark.parametrize("name", ["float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"])
def test_nan_into_formats_without_nan(name: str) -> None:
    """ml_dtypes turns NaN into a zero of the opposite sign; lowbit raises, or writes +0
    with nan='zero' (docs/formats.md)."""
    fmt = lowbit.format(name)
    x = np.array([np.nan, -np.nan], dtype=np.float32)
    theirs = fmt.decode(_ml_codes(fmt, x))
    assert theirs.tolist() == [0.0, 0.0] and np.signbit(theirs).tolist() == [True, False]
    with pytest.raises(NaNPolicyError):
        fmt.encode(x)
    assert fmt.encode(x, nan="zero").tolist() == [0, 0]


def test_e8m0_zero_and_negatives() -> None:
    """ml_dtypes: 0 and negatives -> NaN. lowbit: 0 -> 0x00 (the smallest scale, as torch
    gives), negatives -> NaN (0x00 with saturate=True)."""
    e8m0 = lowbit.format("float8_e8m0fnu")
    x = np.array([0.0, -0.0, -1.0, -1e-30], dtype=np.float32)
    assert _ml_codes(e8m0, x).tolist() == [0xFF] * 4
    assert e8m0.encode(x).tolist() == [0x00, 0x00, 0xFF, 0xFF]
    assert e8m0.encode(x, saturate=True).tolist() == [0x00] * 4


def test_e8m0_float32_subnormal_inputs() -> None:
    """For float32 subnormal inputs ml_dtypes before 0.7 (and torch) round on the bit fields
    and can land on the farther power of two; lowbit rounds by value, as the reference does,
    and so does ml_dtypes 0.7 (every such input then agrees)."""
    e8m0 = lowbit.format("float8_e8m0fnu")
    x = _as(_bf16_patterns(), np.float32)
    x = x[(x > 0) & (x < F32_SUBNORMAL)]
    mine, theirs = e8m0.encode(x), _ml_codes(e8m0, x)
    assert [ref.encode(e8m0, float(v)) for v in x] == mine.tolist()
    # 1.4 * 2**-127 lies nearer 2**-127 (code 0x00) than 2**-126
    assert e8m0.encode(np.float32(1.4 * 2.0**-127)).tolist() == 0x00
    theirs_one = _ml_codes(e8m0, np.array([1.4 * 2.0**-127], dtype=np.float32)).tolist()
    if ML_DTYPES_07:
        np.testing.assert_array_equal(mine, theirs)
        assert theirs_one == [0x00]
        return
    differ = mine != theirs
    assert differ.sum() > 0  # the difference is real
    xv = x.astype(np.float64)
    mine_err = np.abs(e8m0.decode(mine, dtype=np.float64) - xv)
    their_err = np.abs(e8m0.decode(theirs, dtype=np.float64) - xv)
    assert (mine_err[differ] < their_err[differ]).all()
    assert theirs_one == [0x01]


# ---- ml_dtypes: integers ----------------------------------------------------------------


@pytest.mark.parametrize("name", ML_INTS)
def test_ml_dtypes_integer_casts_truncate(name: str) -> None:
    """ml_dtypes' int2/int4/uint2/uint4 casts truncate toward zero: before 0.7 they are
    lowbit's toward_zero + saturate=False (out of range wraps modulo 2^n); from 0.7 a value
    whose truncation is out of range gives 0, and every other is toward_zero. Every finite
    float16 and bfloat16 value below 2**31 and 2**20 random float32."""
    fmt = lowbit.format(name)
    x = np.concatenate(
        [
            _as(_f16_patterns(), np.float32),
            _as(_bf16_patterns(), np.float32),
            np.random.default_rng(1).uniform(-300, 300, 1 << 20).astype(np.float32),
        ]
    )
    x = x[np.isfinite(x) & (np.abs(x) < 2.0**31)]
    got = fmt.encode(x, rounding="toward_zero", saturate=False)
    if ML_DTYPES_07:
        t = np.trunc(x.astype(np.float64))
        out = (t < fmt.min) | (t > fmt.max)
        assert 0 < out.sum() < x.size  # both cases occur
        got = np.where(out, fmt.encode(np.zeros(1))[0], got)
    np.testing.assert_array_equal(got, _ml_codes(fmt, x))


def test_integer_defaults_round_and_saturate() -> None:
    """lowbit's own integer default rounds to nearest and saturates: -0.5 -> 0 and 0.3 -> 0
    where a popular article's example gives -1; 9 -> 7 where ml_dtypes wraps to -7 (before
    0.7) or gives 0 (0.7)."""
    int4 = lowbit.format("int4")
    assert int4.decode(int4.encode([-0.5, 0.3, 9.0, -2.5])).tolist() == [0.0, 0.0, 7.0, -2.0]
    with np.errstate(invalid="ignore"):  # 0.7 signals the out-of-range cast
        theirs = np.array([9.0], dtype=np.float32).astype(ml_dtypes.int4).astype(np.float32)
    assert theirs.tolist() == ([0.0] if ML_DTYPES_07 else [-7.0])


# ---- torch ------------------------------------------------------------------------------

TORCH_MODES = {  # lowbit's keyword arguments that reproduce torch's .to(dtype)
    "bfloat16": {},
    "float16": {},
    "float8_e4m3fn": {"saturate": True},  # torch saturates, infinities to ±448 too
    "float8_e5m2": {},
    "float8_e4m3fnuz": {},
    "float8_e5m2fnuz": {},
    "float8_e8m0fnu": {},  # on |x|: torch ignores the sign
}


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(TORCH_MODES))
def test_torch_casts(name: str) -> None:
    """torch's float32 casts, bit for bit, on every float16/bfloat16 value, specials and
    2**20 random float32 patterns, in the mode that reproduces each one."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    fmt = lowbit.format(name)
    x = np.concatenate(
        [
            _as(_f16_patterns(), np.float32),
            _as(_bf16_patterns(), np.float32),
            _specials(fmt),
            _random_f32(1 << 20, 2),
        ]
    )
    tdtype = getattr(torch, name)
    view = torch.uint8 if fmt.bits == 8 else torch.int16
    theirs = torch.from_numpy(x).to(tdtype).view(view).numpy().view(fmt.code_dtype)
    xin = np.abs(x) if name == "float8_e8m0fnu" else x
    mine = fmt.encode(xin, **TORCH_MODES[name])
    same = _same_codes(fmt, mine, theirs)
    if name == "bfloat16":  # torch writes every NaN as 0xFFFF (sign set)
        same |= np.isnan(x) & (theirs == 0xFFFF) & (mine & 0x7FFF == 0x7FC0)
    if name == "float8_e8m0fnu":  # float32 subnormal inputs: as ml_dtypes < 0.7 (above)
        same |= (np.abs(x) < F32_SUBNORMAL) & (x != 0)
    assert same.all(), (x[~same][:5], mine[~same][:5], theirs[~same][:5])


@pytest.mark.torch
def test_torch_e4m3fn_saturates_and_e8m0_keeps_zero() -> None:
    """torch: 465, 1e6 and inf -> ±448 in float8_e4m3fn (lowbit's saturate=True; default
    gives NaN as OCP non-SAT and ml_dtypes); 0 -> 0x00 in float8_e8m0fnu (as lowbit)."""
    torch = pytest.importorskip("torch")
    x = np.array([465.0, 1e6, np.inf, -np.inf], dtype=np.float32)
    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert theirs.tolist() == [0x7E, 0x7E, 0x7E, 0xFE]
    e4m3 = lowbit.format("float8_e4m3fn")
    assert e4m3.encode(x, saturate=True).tolist() == theirs.tolist()
    assert e4m3.encode(x).tolist() == [0x7F, 0x7F, 0x7F, 0xFF]
    zero = torch.zeros(1).to(torch.float8_e8m0fnu).view(torch.uint8).numpy()
    assert zero.tolist() == lowbit.format("e8m0").encode([0.0]).tolist() == [0x00]


# ---- float64: single rounding -----------------------------------------------------------


def test_float64_is_rounded_once() -> None:
    """1.0625 + 2**-40 lies above the 1.0/1.125 midpoint: rounded once it is 1.125; ml_dtypes
    before 0.7 (and torch) round it to float32 first (1.0625, a tie) and then to even, 1.0;
    ml_dtypes 0.7 rounds once, as lowbit does."""
    x = 1.0625 + 2.0**-40
    e4m3 = lowbit.format("float8_e4m3fn")
    assert float(e4m3.round(x)) == 1.125
    assert ref.encode(e4m3, x) == int(e4m3.encode(x)) == 0x39
    theirs = float(np.array([x]).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)[0])
    assert theirs == (1.125 if ML_DTYPES_07 else 1.0)
    assert float(e4m3.round(np.float32(x))) == 1.0  # from float32 input lowbit agrees


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "bfloat16"])
def test_float64_double_rounding_is_what_differs(name: str) -> None:
    """On float64 values just off the midpoints, lowbit is the reference; ml_dtypes before
    0.7 is lowbit applied to float32(x) (double rounding) and disagrees on a counted share;
    ml_dtypes 0.7 rounds once and agrees on every value."""
    fmt = lowbit.format(name)
    vals = fmt.values()
    rng = np.random.default_rng(8)
    a = rng.choice(vals[:-1], 4000)
    b = vals[np.searchsorted(vals, a) + 1]
    mid = a / 2 + b / 2
    off = np.ldexp(
        rng.choice([-1.0, 1.0], a.size), np.floor(np.log2(np.abs(mid) + 1e-300)).astype(int) - 40
    )
    x = np.where(mid != 0, mid + off, mid)
    mine = fmt.encode(x)
    assert mine.tolist() == [ref.encode(fmt, float(v)) for v in x]
    with np.errstate(over="ignore"):
        theirs = _ml_codes(fmt, x)
        via32 = fmt.encode(x.astype(np.float32))
    assert (via32 != mine).mean() > 0.2  # double rounding differs on a counted share
    np.testing.assert_array_equal(theirs, mine if ML_DTYPES_07 else via32)


# ---- gfloat -----------------------------------------------------------------------------


def _gfloat_info(fmt: lowbit.FloatFormat) -> Any:
    from gfloat import Domain, FormatInfo

    high_nans = {"ieee": (1 << fmt.mbits) - 1, "high": 1, "neg_zero": 0, "none": 0}
    return FormatInfo(
        fmt.name,
        k=fmt.bits,
        precision=fmt.mbits + 1,
        bias=fmt.bias,
        is_signed=fmt.signed,
        domain=Domain.Extended if fmt.has_inf else Domain.Finite,
        has_nz=fmt.has_negative_zero,
        num_high_nans=high_nans[fmt.nan.value],
        has_subnormals=fmt.subnormals,
        is_twos_complement=False,
    )


GFLOAT_FORMATS = [
    "tensorfloat32",
    "bfloat16",
    "float16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
    *sorted(n for n in lowbit.FORMATS if n.startswith("p3109")),
    "p3109_k16p11se",
]
GFLOAT_MODES = {
    "nearest_even": "TiesToEven",
    "nearest_away": "TiesToAway",
    "toward_zero": "TowardZero",
    "toward_positive": "TowardPositive",
    "toward_negative": "TowardNegative",
}


@functools.cache
def _gfloat_sample(fmt: lowbit.FloatFormat) -> np.ndarray:
    """float64 inputs: random codes' values, the midpoints to the next code and the float64
    either side, random points between, scaled copies, and the specials."""
    rng = np.random.default_rng(fmt.bits)
    n = 6000
    codes = rng.integers(0, (1 << fmt.bits) - 1, n)
    v = fmt.decode(codes, dtype=np.float64)
    w = fmt.decode(codes + 1, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        mid = v / 2 + w / 2
        between = v + (w - v) * rng.uniform(0, 1, n)
        scaled = v * np.ldexp(1.0, rng.integers(-4, 5, n))
    x = np.concatenate(
        [v, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), between, scaled]
    )
    x = x[np.isfinite(x)]
    extra = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e300, -1e300, 5e-324, -5e-324]
    return np.concatenate([x, extra])


def _p1_tie(fmt: lowbit.FloatFormat, x: np.ndarray) -> np.ndarray:
    """Exact ties between two powers of two in a format without mantissa bits."""
    if fmt.mbits:
        return np.zeros(x.shape, dtype=bool)
    m, _ = np.frexp(np.abs(x))
    return m == 0.75


@pytest.mark.parametrize("path", CODEC_PATHS)
@pytest.mark.parametrize("name", GFLOAT_FORMATS)
def test_gfloat_float64_every_mode(name: str, path: str) -> None:
    """float64 inputs in every rounding mode gfloat has, saturating or not: lowbit rounds as
    gfloat.round_ndarray does. The one deliberate difference: with no mantissa bit both tie
    candidates are odd and lowbit takes the larger (IEEE 754's one-digit rule, ml_dtypes,
    torch); gfloat takes the even code."""
    import gfloat

    fmt = lowbit.format(name)
    fi = _gfloat_info(fmt)
    x = _gfloat_sample(fmt)
    if not fmt.signed:
        x = np.abs(x)  # gfloat folds the sign of unsigned formats' inputs
    for mode, gmode in GFLOAT_MODES.items():
        for saturate in (False, True):
            xs = x
            if not fmt.has_nan:
                xs = xs[~np.isnan(xs)]
                if not fmt.has_inf and not saturate:  # gfloat raises there; lowbit: ±max
                    xs = xs[np.abs(xs) <= fmt.max]
            with np.errstate(over="ignore", invalid="ignore"):
                theirs = gfloat.round_ndarray(fi, xs, getattr(gfloat.RoundMode, gmode), saturate)
            with codec_path(path):
                mine = fmt.decode(
                    fmt.encode(xs, rounding=mode, saturate=saturate), dtype=np.float64
                )
            same = (mine == theirs) & (np.signbit(mine) == np.signbit(theirs))
            same |= np.isnan(mine) & np.isnan(theirs)
            if mode == "nearest_even":
                tie = _p1_tie(fmt, xs) & ~same
                with codec_path(path):
                    away = fmt.decode(
                        fmt.encode(xs[tie], rounding="nearest_away", saturate=saturate),
                        dtype=np.float64,
                    )
                np.testing.assert_array_equal(mine[tie], away)
                same |= tie
            assert same.all(), (mode, saturate, xs[~same][:5], mine[~same][:5], theirs[~same][:5])


def test_gfloat_p1_ties_differ_only_on_even_codes() -> None:
    """p3109_k8p1se (bias 64, values 2**(c - 64)): lowbit sends every tie to the larger
    power of two; gfloat to the even code: 3.0 -> 4 in both, 6.0 -> 8 vs 4 (code 66)."""
    import gfloat

    fmt = lowbit.format("p3109_k8p1se")
    fi = _gfloat_info(fmt)
    x = np.array([3.0, 6.0, 1.5, 0.75])
    theirs = gfloat.round_ndarray(fi, x, gfloat.RoundMode.TiesToEven)
    mine = fmt.round(x)
    assert mine.tolist() == [4.0, 8.0, 2.0, 1.0]
    assert theirs.tolist() == [4.0, 4.0, 1.0, 1.0]


@pytest.mark.parametrize("path", CODEC_PATHS)
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "p3109_k8p3se"])
def test_gfloat_stochastic(name: str, path: str) -> None:
    """Stochastic rounding with s random bits: gfloat's srbits = 2**s - 1 - R matches lowbit's
    random_bits = R << (64 - s) exactly at fractions j / 2**s of a gap."""
    import gfloat

    fmt = lowbit.format(name)
    fi = _gfloat_info(fmt)
    s = 5
    vals = fmt.values()
    rng = np.random.default_rng(12)
    a = rng.choice(vals[:-1], 300)
    b = vals[np.searchsorted(vals, a) + 1]
    j = rng.integers(0, 1 << s, a.size)
    x = a + (b - a) * j / (1 << s)
    r = rng.integers(0, 1 << s, a.size)
    for saturate in (False, True):
        theirs = gfloat.round_ndarray(
            fi, x, gfloat.RoundMode.Stochastic, saturate, srbits=(1 << s) - 1 - r, srnumbits=s
        )
        rb = r.astype(np.uint64) << np.uint64(64 - s)
        with codec_path(path):
            codes = fmt.encode(x, rounding="stochastic", saturate=saturate, random_bits=rb)
        mine = fmt.decode(codes, dtype=np.float64)
        same = (mine == theirs) | (np.isnan(mine) & np.isnan(theirs))
        assert same.all(), (x[~same][:5], mine[~same][:5], theirs[~same][:5])
