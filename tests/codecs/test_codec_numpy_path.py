"""_numpy_fast: the numpy path's code tables and casts give exactly the general loop's codes
(``_general.encode_general``, itself tested against the exact reference), on every class
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
from lowbit.codecs import _general
from lowbit.codecs import _numba as _fast
from lowbit.codecs import _numpy_fast as fast
from lowbit.codecs import vectorised as codec
from lowbit.enums import Rounding
from lowbit.formats import reference as ref
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


_WORTH_A_TABLE = fast._worth_a_table


@pytest.fixture(autouse=True)
def _numpy_path(monkeypatch: pytest.MonkeyPatch):
    """Kernels off; a table is built on the first call, however few the values."""
    monkeypatch.setattr(fast, "_worth_a_table", lambda key, n, entries: True)
    with _fast.numpy_only():
        yield


def _loop(fmt: FloatFormat, x: np.ndarray, mode: Rounding, sat: bool) -> np.ndarray:
    return _general.encode_general(fmt, x.reshape(-1), mode, sat, None, False, False)


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
def _prefix_grid(dtype: np.dtype, prefix: int) -> np.ndarray:
    """Every ``prefix``-bit prefix with the lower bits zero, one and all ones (for 16-bit
    prefixes also the top one alone)."""
    uint = np.dtype(f"u{dtype.itemsize}")
    low = 8 * dtype.itemsize - prefix
    tops = np.arange(1 << prefix, dtype=uint) << uint.type(low)
    lows = [0, 1, (1 << low) - 1] + ([1 << (low - 1)] if prefix == 16 else [])
    return (tops[:, None] | np.array(lows, dtype=uint)).reshape(-1).view(dtype)


def _keyed_inputs(dtype: np.dtype, prefix: int, fmt: FloatFormat) -> np.ndarray:
    """The prefix grid, and every decision point of ``fmt`` with its neighbours in ``dtype``."""
    with np.errstate(over="ignore"):
        p = _decision_points(fmt).astype(dtype)
    near = [p, np.nextafter(p, dtype.type(np.inf)), np.nextafter(p, dtype.type(-np.inf))]
    return np.concatenate([_prefix_grid(dtype, prefix), *near])


# ---- which formats take which path ------------------------------------------------------


def test_key_widths() -> None:
    """Every catalog format of at most 8 bits keys float32 input by its top 16 bits (a
    regression to the general loop would be silent otherwise), float16 by 20, bfloat16
    by 17; float64 input needs 12 + mbits + 1 bits, at most 20."""
    for name in CATALOG_FLOATS:
        fmt = lowbit.format(name)
        if fmt.bits <= 8:
            assert fast.key_prefix(fmt, F32) == 16, name
            want64 = 12 + fmt.mbits + 1 if fmt.mbits <= 7 else None
            assert fast.key_prefix(fmt, F64) == (max(16, want64) if want64 else None), name
    assert fast.key_prefix(lowbit.format("float16"), F32) == 20
    assert fast.key_prefix(lowbit.format("bfloat16"), F32) == 17
    assert fast.key_prefix(lowbit.format("float16"), F64) is None
    assert fast.key_prefix(CUSTOM[4], F32) == 16  # 16-bit code, 5 mantissa bits
    assert fast.key_prefix(CUSTOM[5], F32) == 19  # 9 mantissa bits
    e9m5 = FloatFormat(name="c_e9m5", ebits=9, mbits=5, inf="high", nan="high")
    assert fast.key_prefix(e9m5, F32) is None  # values below float32's range


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
    monkeypatch.setattr(_general, "encode_general", None)  # calling it would fail
    assert np.array_equal(fmt.encode(x), want)


@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_empty_input_after_a_table_is_built(dtype: np.dtype) -> None:
    """An empty array encodes to no codes once the table exists (it split 0 values into
    pieces of 0 and raised ValueError)."""
    fmt = lowbit.format("float8_e4m3fn")
    fmt.encode(np.random.default_rng(2).standard_normal(1 << 18).astype(dtype))  # the table
    for mode in ("nearest_even", "nearest_away", "toward_zero"):
        got = fmt.encode(np.zeros(0, dtype), rounding=mode)
        assert got.shape == (0,) and got.dtype == fmt.code_dtype


def test_small_inputs_wait_for_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table is built only once as many values have been encoded alike as it has
    entries; until then float16 takes numpy's cast and other formats the general loop."""
    monkeypatch.setattr(fast, "_worth_a_table", _WORTH_A_TABLE)
    e4m3 = FloatFormat(name="c_wait_e4m3", ebits=4, mbits=3, inf="none", nan="high")
    f16 = FloatFormat(name="c_wait_f16", ebits=5, mbits=10)  # float16's layout
    for fmt, n in ((e4m3, 100_000), (f16, 1 << 20)):  # tables of 2**17 and 2**21 codes
        x = np.linspace(-3, 3, n, dtype=np.float32)
        want = _general.encode_general(fmt, x, Rounding.NEAREST_EVEN, False, None, False, False)
        for built in (False, True):
            assert np.array_equal(fmt.encode(x), want)
            assert any(k[0] is fmt for k in fast._tables) == built, fmt.name


# ---- encode: keyed tables, lookups, casts ---------------------------------------------


@pytest.mark.parametrize("sat", [False, True])
@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_keyed_tables_match_the_general_loop(dtype: np.dtype, fmt: FloatFormat, sat: bool) -> None:
    """Every 16-bit prefix with zero, one and full lower bits, and each decision point and
    its neighbours: the keyed table's codes are the general loop's, in every mode."""
    prefix = fast.key_prefix(fmt, dtype)
    if prefix is None:
        pytest.skip("no key of at most 21 bits: the general loop serves it")
    x = _keyed_inputs(dtype, prefix, fmt)
    if not fmt.signed and not fmt.has_nan and not sat:
        x = x[~(x < 0)]  # refused, tested below
    for mode in MODES:
        got = codec.encode_float(
            fmt, x, rounding=mode, saturate=sat, seed=None, random_bits=None, nan="zero"
        )
        _assert_same(fmt, x, got, _loop(fmt, x, mode, sat))


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
        _assert_same(fmt, x, got, _loop(fmt, x, mode, sat))


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
def test_float32_casts_match_the_general_loop(
    name: str, sat: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 into bfloat16 (ml_dtypes' cast) and float16 (numpy's, NaNs rewritten), both
    saturations: every class of input the cast distinguishes gives the general loop's code."""
    monkeypatch.setattr(fast, "_worth_a_table", lambda key, n, entries: False)
    fmt = lowbit.format(name)
    assert fast._cast_peer(fmt, Rounding.NEAREST_EVEN) is not None
    x = _cast_inputs(name)
    got = fmt.encode(x, saturate=sat)
    _assert_same(fmt, x, got, _loop(fmt, x, Rounding.NEAREST_EVEN, sat))


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
            _general.encode_general(fmt, y, Rounding.NEAREST_EVEN, False, None, True, True)
        assert str(info.value) == str(general.value)
    y = x.copy()
    y[0], y[-1] = -1.0, np.nan
    with pytest.raises(NaNPolicyError):
        unsigned.encode(y)
    y[0], y[-2] = 1.0, -1.0  # the only negative beside a NaN, NaN allowed: it counts
    with pytest.raises(LowbitError, match="negative input") as info:
        unsigned.encode(y, nan="zero")
    assert not isinstance(info.value, NaNPolicyError)
    y[-2] = 1.0
    unsigned.encode(y, nan="zero")  # NaN alone: no error
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
