"""_numpy_fast: the numpy path's code tables and casts give exactly the general loop's codes
(``vectorised._encode_general``, itself tested against the exact reference), on every class
of input their keys distinguish, every float format of at most 16 bits and every mode.

Every test here runs with the compiled kernels off and tables built on first use.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit import FloatFormat, LowbitError, NaNPolicyError, _parallel
from lowbit.codecs import _numba as _fast
from lowbit.codecs import _numpy_fast as fast
from lowbit.codecs import vectorised as codec
from lowbit.formats import reference as ref
from lowbit.formats.enums import Rounding
from strategies import CATALOG_FLOATS, DETERMINISTIC, bit_pattern, input_arrays, random_bits

# Layouts beyond the catalog: no subnormals with a zero, signed without a zero, unsigned
# without NaN (negatives refused), IEEE specials without subnormals, a 16-bit code on the
# bfloat16 grid, one off it, and an all-subnormal layout.
CUSTOM = [
    FloatFormat(name="c_e3m3_nosub", ebits=3, mbits=3, subnormals=False, inf="none", nan="none"),
    FloatFormat(name="c_s_e4m0_nozero", ebits=4, mbits=0, subnormals=False, inf="none", nan="high"),
    FloatFormat(name="c_u_e3m3_finite", ebits=3, mbits=3, signed=False, inf="none", nan="none"),
    FloatFormat(name="c_e4m2_nosub_ieee", ebits=4, mbits=2, subnormals=False),
    FloatFormat(name="c_e8m5", ebits=8, mbits=5, inf="high", nan="high"),
    FloatFormat(name="c_e6m9", ebits=6, mbits=9, inf="high", nan="neg_zero"),
    FloatFormat(name="c_e0m6_fixed", ebits=0, mbits=6, inf="none", nan="neg_zero"),
]
SMALL = [lowbit.format(n) for n in CATALOG_FLOATS if lowbit.format(n).bits <= 16] + CUSTOM
IDS = [f.name for f in SMALL]
MODES = [Rounding(m) for m in DETERMINISTIC]
F16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


@pytest.fixture(autouse=True)
def _numpy_path(monkeypatch: pytest.MonkeyPatch):
    """Kernels off; a table is built on the first call, however few the values."""
    monkeypatch.setattr(fast, "_TABLE_AFTER", 0)
    with _fast.numpy_only():
        yield


def _general(fmt: FloatFormat, x: np.ndarray, mode: Rounding, sat: bool) -> np.ndarray:
    return codec._encode_general(fmt, x.reshape(-1), mode, sat, None, False, False)


def _assert_same(fmt: FloatFormat, x: np.ndarray, got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    bad = np.flatnonzero(got.reshape(-1) != want)
    if bad.size:
        i = bad[:5]
        raise AssertionError(
            f"{fmt.name}: {bad.size} codes differ, e.g. input bits "
            f"{[hex(int(v)) for v in x.reshape(-1)[i].view(f'u{x.itemsize}')]} -> "
            f"{got.reshape(-1)[i].tolist()}, general loop {want[i].tolist()}"
        )


def _decision_points(fmt: FloatFormat) -> np.ndarray:
    """The format's magnitudes, their midpoints, the overflow threshold, both signs."""
    v = np.unique(np.abs(fmt.values()))
    top = float(np.floor(np.log2(fmt.max)))
    over = fmt.max + 2.0 ** (top - fmt.mbits) / 2
    p = np.concatenate([v, (v[:-1] + v[1:]) / 2, [over, 2 * over]])
    return np.concatenate([p, -p])


@functools.cache
def _prefix_grid(dtype: np.dtype) -> np.ndarray:
    """Every 16-bit prefix with the lower bits zero, one, the top one alone, all ones."""
    uint = np.dtype(f"u{dtype.itemsize}")
    low = 8 * dtype.itemsize - 16
    tops = np.arange(1 << 16, dtype=uint) << uint.type(low)
    lows = np.array([0, 1, 1 << (low - 1), (1 << low) - 1], dtype=uint)
    return (tops[:, None] | lows).reshape(-1).view(dtype)


def _keyed_inputs(dtype: np.dtype, fmt: FloatFormat) -> np.ndarray:
    """The prefix grid, and every decision point of ``fmt`` with its neighbours in ``dtype``."""
    with np.errstate(over="ignore"):
        p = _decision_points(fmt).astype(dtype)
    near = [p, np.nextafter(p, dtype.type(np.inf)), np.nextafter(p, dtype.type(-np.inf))]
    return np.concatenate([_prefix_grid(dtype), *near])


# ---- which formats take which path ------------------------------------------------------


def test_fp8_fp6_fp4_take_the_keyed_tables() -> None:
    """Every catalog format of at most 8 bits is on the float32 key grid (a regression to
    the general loop would be silent otherwise); formats with more mantissa bits are not."""
    for name in CATALOG_FLOATS:
        fmt = lowbit.format(name)
        if fmt.bits <= 8:
            assert fast.on_key_grid(fmt, F32), name
            assert fast.on_key_grid(fmt, F64) == (fmt.mbits <= 3), name
    for name in ("float16", "bfloat16"):
        assert not fast.on_key_grid(lowbit.format(name), F32)
    assert not fast.on_key_grid(CUSTOM[5], F32)  # 9 mantissa bits
    assert fast.on_key_grid(CUSTOM[4], F32)  # 16-bit code, 5 mantissa bits


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float4_e2m1fn", "float16", "bfloat16"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_large_inputs_skip_the_general_loop(
    name: str, dtype: np.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a table is built (or for a cast), encoding float32/16-bit input never runs the
    general loop."""
    fmt = lowbit.format(name)
    x = np.random.default_rng(1).standard_normal(1 << 16).astype(dtype)
    want = fmt.encode(x)  # builds the table
    monkeypatch.setattr(codec, "_encode_general", None)  # calling it would fail
    assert np.array_equal(fmt.encode(x), want)


def test_small_inputs_wait_for_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table is built only after as many values as building it costs have been encoded."""
    monkeypatch.setattr(fast, "_TABLE_AFTER", 1000)
    fmt = FloatFormat(name="c_wait_e4m3", ebits=4, mbits=3, inf="none", nan="high")
    x = np.linspace(-3, 3, 600, dtype=np.float32)
    fmt.encode(x)
    assert not any(k[0] is fmt for k in fast._tables)
    fmt.encode(x)
    assert any(k[0] is fmt for k in fast._tables)


# ---- encode: keyed tables, lookups, casts ---------------------------------------------


@pytest.mark.parametrize("sat", [False, True])
@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_keyed_tables_match_the_general_loop(dtype: np.dtype, fmt: FloatFormat, sat: bool) -> None:
    """Every 16-bit prefix with zero, one and full lower bits, and each decision point and
    its neighbours: the keyed table's codes are the general loop's, in every mode."""
    if not fast.on_key_grid(fmt, dtype):
        pytest.skip("not on the key grid: the general loop (or a cast) serves it")
    x = _keyed_inputs(dtype, fmt)
    if not fmt.signed and not fmt.has_nan and not sat:
        x = x[~(x < 0)]  # refused, tested below
    for mode in MODES:
        got = codec.encode_float(
            fmt, x, rounding=mode, saturate=sat, seed=None, random_bits=None, nan="zero"
        )
        _assert_same(fmt, x, got, _general(fmt, x, mode, sat))


@pytest.mark.parametrize("sat", [False, True])
@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_16_bit_inputs_every_pattern(dtype: np.dtype, fmt: FloatFormat, sat: bool) -> None:
    """All 65,536 float16 or bfloat16 inputs, every mode: the lookup is the general loop."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    if not fmt.signed and not fmt.has_nan and not sat:
        with np.errstate(invalid="ignore"):
            x = x[~(x < 0)]  # refused, tested below
    for mode in MODES:
        got = codec.encode_float(
            fmt, x, rounding=mode, saturate=sat, seed=None, random_bits=None, nan="zero"
        )
        _assert_same(fmt, x, got, _general(fmt, x, mode, sat))


@functools.cache
def _cast_inputs(name: str) -> np.ndarray:
    """float32 inputs covering every class a nearest-even cast to ``name`` distinguishes:
    sign, exponent, the kept mantissa bits, the round bit (every pattern of the bits
    above it), and the bits below it zero, one, all ones, or exactly half (with the
    round bit). bfloat16 keeps 7 bits (16 below), float16 10 (13 below, 12 below the
    round bit)."""
    below = 16 if name == "bfloat16" else 12
    tops = np.arange(1 << (32 - below), dtype=np.uint32) << np.uint32(below)
    lows = np.array([0, 1, (1 << (below - 1)) - 1, 1 << (below - 1),
                     (1 << (below - 1)) + 1, (1 << below) - 1], dtype=np.uint32)  # fmt: skip
    return (tops[:, None] | lows).reshape(-1).view(np.float32)


@pytest.mark.parametrize("sat", [False, True])
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_float32_casts_match_the_general_loop(name: str, sat: bool) -> None:
    """float32 into bfloat16 (ml_dtypes' cast) and float16 (numpy's, NaNs rewritten), both
    saturations: every class of input the cast distinguishes gives the general loop's code."""
    fmt = lowbit.format(name)
    assert fast._cast_peer(fmt, Rounding.NEAREST_EVEN) is not None
    x = _cast_inputs(name)
    got = fmt.encode(x, saturate=sat)
    _assert_same(fmt, x, got, _general(fmt, x, Rounding.NEAREST_EVEN, sat))


# ---- errors, threads, decode ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16])
def test_nan_and_negative_errors_as_the_general_loop(dtype: np.dtype) -> None:
    """NaN into FP4 raises NaNPolicyError, negatives into an unsigned format without NaN
    raise LowbitError, NaN first when both occur, wherever in a large array they are."""
    fp4, unsigned = lowbit.format("float4_e2m1fn"), CUSTOM[2]
    x = np.linspace(0, 3, 1 << 18).astype(dtype)
    for fmt, bad, error in ((fp4, np.nan, NaNPolicyError), (unsigned, -1.0, LowbitError)):
        y = x.copy()
        y[-1] = bad
        with pytest.raises(error) as info:
            fmt.encode(y)
        with pytest.raises(error) as general:
            codec._encode_general(fmt, y, Rounding.NEAREST_EVEN, False, None, True, True)
        assert str(info.value) == str(general.value)
    y = x.copy()
    y[0], y[-1] = -1.0, np.nan
    with pytest.raises(NaNPolicyError):
        unsigned.encode(y)
    y[0] = 1.0
    codes = fp4.encode(y, nan="zero")
    assert codes[-1] == 0 and np.array_equal(codes[:-1], fp4.encode(y[:-1]))


@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16])
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float16", "bfloat16", "float6_e2m3fn"])
def test_threads_do_not_change_codes(name: str, dtype: np.dtype) -> None:
    """Arrays split across threads encode and decode as on one thread."""
    fmt = lowbit.format(name)
    x = (np.random.default_rng(3).standard_normal(3 * fast._PIECE + 5) * 8).astype(dtype)
    codes = fmt.encode(x)
    values = fmt.decode(codes)
    with _parallel.serial():
        assert np.array_equal(fmt.encode(x), codes)
        assert np.array_equal(bit_pattern(fmt.decode(codes)), bit_pattern(values))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
def test_decode_is_the_value_table(fmt: FloatFormat, dtype: type) -> None:
    """Every code (repeated past a chunk, odd length, 2-D): each value's bits are the value
    table's, NaN payloads dropped (the bfloat16 cast path included)."""
    n = 1 << fmt.bits
    codes = np.resize(np.arange(n, dtype=np.uint32), 2 * fast._STEP + 3)
    codes = codes.astype(fmt.code_dtype)[: 2 * fast._STEP + 2].reshape(2, -1)
    with np.errstate(over="ignore"):  # values beyond the dtype's range become ±inf
        got = fmt.decode(codes, dtype)
        table = codec.value_table(fmt, np.dtype(dtype))
    want = table[codes.astype(np.intp)]
    assert got.dtype == want.dtype and got.shape == codes.shape
    assert np.array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{got.itemsize}"))
    assert fmt.decode(codes[0, 3], dtype).shape == ()


# ---- properties -------------------------------------------------------------------------


@st.composite
def _cases(draw: st.DrawFn) -> tuple:
    fmt = draw(st.sampled_from(SMALL))
    dtype = draw(st.sampled_from([F64, F32, F16, BF16]))
    x = draw(input_arrays(fmt, dtype))
    mode = draw(st.sampled_from([*DETERMINISTIC, "stochastic"]))
    sat = draw(st.booleans())
    bits = np.array(draw(st.lists(random_bits, min_size=x.size, max_size=x.size)), np.uint64)
    return fmt, x, mode, sat, bits


@settings(max_examples=300, deadline=None)
@given(case=_cases())
def test_numpy_path_is_the_reference(case: tuple) -> None:
    """Random float64/float32/float16/bfloat16 inputs (subnormals, halfway points and their
    neighbours, NaN, inf, huge values), any format of at most 16 bits, every mode, both
    saturations: the numpy path's codes are the exact reference's, or it raises as the
    reference does."""
    fmt, x, mode, sat, bits = case
    wants, errors = [], set()
    with np.errstate(invalid="ignore"):  # signalling NaNs widen quietly
        wide = x.astype(np.float64)
    for xi, bi in zip(wide, bits, strict=True):
        try:
            wants.append(ref.encode(fmt, float(xi), mode, sat, int(bi), "raise"))
        except LowbitError as exc:
            errors.add(type(exc))
    rb = bits if mode == "stochastic" else None
    if errors:
        with pytest.raises(LowbitError) as info:
            fmt.encode(x, rounding=mode, saturate=sat, random_bits=rb)
        assert len(errors) > 1 or type(info.value) in errors
    else:
        got = fmt.encode(x, rounding=mode, saturate=sat, random_bits=rb)
        assert got.tolist() == wants, (x, got, wants)
