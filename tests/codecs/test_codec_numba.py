"""_fast: the compiled (numba) codecs give exactly the numpy path's codes and values, on
exhaustive float16/bfloat16 inputs, large random float32/float64 samples, every neighbour
and midpoint of each format, every rounding mode and both overflow settings."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import CodeRangeError, FloatFormat, LowbitError, NaNPolicyError
from lowbit.codecs import _general
from lowbit.codecs import _numba as _fast
from lowbit.quant.scheme_text import parse_scheme
from strategies import CATALOG_FLOATS, ROUNDINGS

pytestmark = pytest.mark.skipif(not _fast.HAVE_NUMBA, reason="numba is not installed")


@pytest.fixture(autouse=True)
def _kernels_at_any_size() -> Iterator[None]:
    """The kernels run on test-sized arrays too (the default leaves small ones to numpy)."""
    with _fast.kernels_always():
        yield


# Layouts beyond the catalog, one per corner the kernels specialise on: no subnormals
# with a zero, with IEEE specials, signed without a zero, unsigned with subnormals and
# without mantissa bits, a 16-bit generic layout, float32's exponent field with few
# mantissa bits, a layout too wide for the float32 core, unsigned without NaN.
CUSTOM = [
    FloatFormat(name="c_e3m3_nosub", ebits=3, mbits=3, subnormals=False, inf="none", nan="none"),
    FloatFormat(name="c_e3m3_nosub_ieee", ebits=3, mbits=3, subnormals=False),
    FloatFormat(name="c_s_e4m0_nozero", ebits=4, mbits=0, subnormals=False, inf="none", nan="high"),
    lowbit.p3109(8, 1, signed=False),
    FloatFormat(name="c_e6m9", ebits=6, mbits=9, inf="high", nan="neg_zero"),
    FloatFormat(name="c_e8m3", ebits=8, mbits=3),
    FloatFormat(name="c_e9m12", ebits=9, mbits=12),
    FloatFormat(name="c_u_e3m3_finite", ebits=3, mbits=3, signed=False, inf="none", nan="none"),
]
FORMATS = [
    lowbit.format(n) for n in CATALOG_FLOATS if lowbit.format(n).bits <= 16 or n == "tensorfloat32"
] + CUSTOM
IDS = [f.name for f in FORMATS]
SETTINGS = [(mode, sat) for mode in ROUNDINGS for sat in (False, True)]


# ---- inputs ---------------------------------------------------------------------------


@functools.cache
def _common_inputs() -> dict[str, np.ndarray]:
    """Inputs shared by every format: all float16 and all bfloat16 bit patterns, and
    uniformly random float32 and float64 bit patterns."""
    rng = np.random.default_rng(20261130)
    all16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    return {
        "float16": all16.view(np.float16),
        "bfloat16_as_float32": (all16.astype(np.uint32) << 16).view(np.float32),
        "float32": rng.integers(0, 1 << 32, 1 << 19, dtype=np.uint64)
        .astype(np.uint32)
        .view(np.float32),
        "float64": rng.integers(0, 2**64, 1 << 17, dtype=np.uint64).view(np.float64),
    }


@functools.cache
def _format_inputs(fmt: FloatFormat) -> dict[str, np.ndarray]:
    """Inputs aimed at one format: random bit patterns with exponents spanning its range
    (a few binades beyond each end), and every value, midpoint and the floats either side
    of each midpoint, in float32 and float64."""
    rng = np.random.default_rng(zlib.crc32(fmt.name.encode()))
    lo = max(fmt.emin - fmt.mbits - 4, -1074)
    hi = min(int(np.log2(fmt.max)) + 3, 1023)

    def near(n: int, dtype: type) -> np.ndarray:
        mant = rng.random(n) + 1.0
        exps = rng.integers(lo, hi + 1, n)
        signs = rng.choice([-1.0, 1.0], n)
        x = np.ldexp(mant * signs, exps)
        with np.errstate(over="ignore"):  # float32: the cast only moves (or clips) a sample
            return x.astype(dtype)

    if fmt.bits <= 16:
        v = fmt.values()
    else:  # a sample of consecutive pairs of codes
        codes = rng.integers(0, fmt.max_code_magnitude, 1 << 14)
        v = fmt.decode(np.concatenate([codes, codes + 1]), np.float64)
    v = np.unique(np.concatenate([v, -v]) if fmt.signed else v)
    mids = (v[:-1] + v[1:]) / 2
    edges = np.concatenate([v, mids, [fmt.max * 2, np.inf, -np.inf, np.nan, -np.nan]])
    out = {
        "float32_near": near(1 << 19, np.float32),
        "float64_near": near(1 << 17, np.float64),
        "edges64": np.concatenate(
            [edges, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)]
        ).astype(np.float64),
    }
    with np.errstate(over="ignore"):
        m32 = mids.astype(np.float32)
        e32 = edges.astype(np.float32)
    out["edges32"] = np.concatenate(
        [e32, np.nextafter(m32, np.float32(np.inf)),
         np.nextafter(m32, np.float32(-np.inf))]
    )  # fmt: skip
    return out


def _random_bits(n: int) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 2**64, n, dtype=np.uint64)


def _encode_both(fmt: FloatFormat, x: np.ndarray, **kw) -> tuple[object, object]:
    """encode on the compiled and on the numpy path: codes, or the error raised."""
    results = []
    for numpy_only in (False, True):
        try:
            if numpy_only:
                with _fast.numpy_only():
                    results.append(fmt.encode(x, **kw))
            else:
                results.append(fmt.encode(x, **kw))
        except LowbitError as exc:
            results.append(exc)
    return results[0], results[1]


def _assert_same(fmt: FloatFormat, x: np.ndarray, fast: object, ref: object, what: str) -> None:
    if isinstance(ref, Exception) or isinstance(fast, Exception):
        assert type(fast) is type(ref) and str(fast) == str(ref), (what, fast, ref)
        return
    assert fast.dtype == ref.dtype, what
    bad = np.flatnonzero(fast != ref)
    if bad.size:
        i = bad[:5]
        raise AssertionError(
            f"{fmt.name} {what}: {bad.size} codes differ, e.g. inputs "
            f"{x.reshape(-1)[i].astype(np.float64).tolist()} -> compiled "
            f"{fast.reshape(-1)[i].tolist()}, numpy {ref.reshape(-1)[i].tolist()}"
        )


# ---- encode ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_encode_paths_agree(fmt: FloatFormat) -> None:
    """Compiled and numpy encoders give identical codes (or the same error) on every input set, mode and overflow setting."""
    inputs = {**_common_inputs(), **_format_inputs(fmt)}
    for name, x in inputs.items():
        rbits = _random_bits(x.size)
        for mode, sat in SETTINGS:
            if mode == "stochastic" and not fmt.subnormals and fmt.has_zero:
                continue  # both paths take numpy's exact-fraction zone code: nothing to compare
            kw = {"rounding": mode, "saturate": sat, "nan": "zero"}
            if mode == "stochastic":
                kw["random_bits"] = rbits
            fast, ref = _encode_both(fmt, x, **kw)
            _assert_same(fmt, x, fast, ref, f"{name} {mode} saturate={sat}")


@pytest.mark.parametrize(
    "name", ["float8_e4m3fn", "float4_e2m1fn", "float8_e8m0fnu", "bfloat16", "float16"]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_runs(name: str, dtype: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled path really encodes (the numpy chunk encoder is never called) for catalog formats and float32/float64 input."""
    fmt = lowbit.format(name)
    x = np.linspace(-3, 3, 1001).astype(dtype)
    expected = fmt.encode(x, rounding="toward_zero")

    def fail(*args: object, **kw: object) -> None:
        raise AssertionError("numpy path taken")

    monkeypatch.setattr(_general, "_encode_chunk", fail)
    for mode in ROUNDINGS:
        fmt.encode(x, rounding=mode, seed=1)
    np.testing.assert_array_equal(fmt.encode(x, rounding="toward_zero"), expected)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float16", "p3109_k8p3se"])
def test_bfloat16_and_float16_arrays_as_input(name: str) -> None:
    """bfloat16 and float16 arrays (widened to float32 for the kernel) encode as on the numpy path."""
    fmt = lowbit.format(name)
    all16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for x in (all16.view(ml_dtypes.bfloat16), all16.view(np.float16)):
        for mode in ("nearest_even", "toward_negative"):
            fast, ref = _encode_both(fmt, x, rounding=mode, nan="zero")
            _assert_same(fmt, x, fast, ref, f"{x.dtype} {mode}")


def test_nan_error_same_on_both_paths() -> None:
    """NaN into a format without NaN raises the same NaNPolicyError on both paths, from float32 and float64."""
    fmt = lowbit.format("float4_e2m1fn")
    for dtype in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16):
        x = np.array([1.0, np.nan, -2.0], dtype=dtype)
        fast, ref = _encode_both(fmt, x)
        assert isinstance(fast, NaNPolicyError)
        _assert_same(fmt, x, fast, ref, str(dtype))
        fast, ref = _encode_both(fmt, x, nan="zero")
        np.testing.assert_array_equal(fast, [0x2, 0x0, 0xC])
        _assert_same(fmt, x, fast, ref, f"{dtype} nan=zero")


def test_negative_error_same_on_both_paths() -> None:
    """A negative value into an unsigned format without NaN raises the same error on both paths; saturating clamps to 0."""
    fmt = CUSTOM[-1]
    for dtype in (np.float32, np.float64):
        x = np.array([1.0, -0.0, -0.25], dtype=dtype)
        fast, ref = _encode_both(fmt, x)
        assert isinstance(fast, LowbitError) and "negative" in str(fast)
        _assert_same(fmt, x, fast, ref, str(dtype))
        fast, ref = _encode_both(fmt, x, saturate=True)
        assert fast[2] == 0
        _assert_same(fmt, x, fast, ref, f"{dtype} saturate")


def test_small_arrays_take_the_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below MIN_KERNEL_SIZE elements the numpy path encodes and decodes (the kernels only
    under kernels_always()); from the threshold on the kernels do, with the same codes."""
    fmt = lowbit.format("float8_e4m3fn")
    n = _fast.MIN_KERNEL_SIZE
    big = np.linspace(-500, 500, n).astype(np.float32)
    with _fast.numpy_only():
        ref = fmt.encode(big)
    calls: list[int] = []
    real = _fast._split

    def spy(call: object, size: int) -> bool:
        calls.append(size)
        return real(call, size)

    monkeypatch.setattr(_fast, "_split", spy)
    monkeypatch.setattr(_fast._choice, "kernels_win", lambda kind, measure: True)  # no timing
    forced = fmt.encode(big[: n - 1])  # under the module's kernels_always()
    assert calls == [n - 1]
    monkeypatch.setattr(_fast._kernels_always, "on", False)  # the default
    calls.clear()
    small = fmt.encode(big[: n - 1])
    values = fmt.decode(small)
    assert calls == [] and not _fast.use_kernels(n - 1)
    large = fmt.encode(big)
    assert calls == [n] and _fast.use_kernels(n)
    assert np.array_equal(large, ref) and np.array_equal(small, ref[: n - 1])
    assert np.array_equal(forced, ref[: n - 1])
    assert np.array_equal(values.view(np.uint32), fmt.decode(ref[: n - 1]).view(np.uint32))


def test_the_kernels_are_bought_once_the_numpy_path_has_cost_their_price() -> None:
    """The ski-rental rule: below the worth the numpy path takes each array and counts it;
    the array that makes the count reach the worth buys the kernels, which then take every
    array of at least MIN_KERNEL_SIZE; numba loaded by anyone buys them at once."""
    loaded = [False]
    r = _fast._Rental(10 * _fast.MIN_KERNEL_SIZE, lambda: loaded[0])
    n = _fast.MIN_KERNEL_SIZE
    assert [r.take(3 * n) for _ in range(3)] == [False, False, False]
    assert r.rented == 9 * n and not r.bought
    assert r.take(n)  # 9n + n reaches the worth
    assert r.bought and r.rented == 9 * n
    assert r.take(n)
    alone = _fast._Rental(10 * n, lambda: False)
    assert alone.take(10 * n) and alone.bought  # one array worth the price
    other = _fast._Rental(10 * n, lambda: loaded[0])
    assert not other.take(n)
    loaded[0] = True
    assert other.take(n) and other.bought


def test_a_small_job_never_imports_numba() -> None:
    """A fresh process quantizing a 1024 x 1024 array (far under KERNEL_WORTH) stays on the
    numpy path and never imports numba; its codes are the kernels' (checked here, in a
    process where the kernels run)."""
    code = (
        "import sys, numpy as np, lowbit\n"
        "from lowbit.quant.scheme_text import parse_scheme\n"
        "x = np.random.default_rng(5).standard_normal((1024, 1024)).astype(np.float32)\n"
        "q = lowbit.quantize(x, parse_scheme('int4:g128'))\n"
        "sys.stdout.write(str('numba' in sys.modules) + ' ' + q.codes.tobytes().hex()[:4096])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LOWBIT_NUMBA"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    imported, codes = out.split()
    assert imported == "False"
    x = np.random.default_rng(5).standard_normal((1024, 1024)).astype(np.float32)
    assert _fast.use_kernels(x.size)  # this process: the kernels
    ours = lowbit.quantize(x, parse_scheme("int4:g128"))
    assert ours.codes.tobytes().hex()[:4096] == codes


def test_numpy_only_nests_and_restores() -> None:
    """numpy_only() turns the kernels off inside, nests, and restores on exit (also after an error)."""
    assert _fast.enabled()
    with _fast.numpy_only():
        assert not _fast.enabled()
        with _fast.numpy_only():
            assert not _fast.enabled()
        assert not _fast.enabled()
    assert _fast.enabled()
    with pytest.raises(RuntimeError), _fast.numpy_only():
        raise RuntimeError
    assert _fast.enabled()


def test_any_shape_and_layout() -> None:
    """Non-contiguous, multi-dimensional and 0-d inputs give the numpy path's codes in the input's shape."""
    fmt = lowbit.format("float8_e4m3fn")
    x = np.random.default_rng(3).standard_normal((6, 8)).astype(np.float32)
    for arr in (x, x.T, x[::2, 1::3], np.float32(0.3), x.astype(np.float64)[:, ::-1]):
        fast, ref = _encode_both(fmt, np.asarray(arr))
        assert fast.shape == np.shape(arr)
        _assert_same(fmt, np.asarray(arr), fast, ref, "layout")


def test_works_without_numba() -> None:
    """With numba unimportable, _fast imports, reports itself disabled and the codecs run on numpy."""
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import numpy as np, lowbit\n"
        "from lowbit.codecs import _numba as _fast\n"
        "assert not _fast.HAVE_NUMBA and not _fast.enabled()\n"
        "f = lowbit.format('float8_e4m3fn')\n"
        "c = f.encode(np.array([0.3952, -448.0], np.float32))\n"
        "assert c.tolist() == [0x2D, 0xFE], c\n"
        "assert f.decode(c).tolist() == [0.40625, -448.0]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lowbit_numba_0_turns_the_kernels_off() -> None:
    """LOWBIT_NUMBA=0 (make test's second pass): no kernel runs and numba is never imported,
    even for arrays large enough for the kernels; the codes are the kernels' own."""
    code = (
        "import sys, numpy as np, lowbit\n"
        "from lowbit.codecs import _numba as _fast\n"
        "assert not _fast.HAVE_NUMBA and not _fast.enabled()\n"
        "x = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)\n"
        "c = lowbit.format('float8_e4m3fn').encode(x)\n"
        "q = lowbit.quantize(x.reshape(512, 512), 'int4', group_size=128)\n"
        "assert 'numba' not in sys.modules\n"
        "sys.stdout.buffer.write(c.tobytes() + np.asarray(q.codes).tobytes())\n"
    )
    env = {**os.environ, "LOWBIT_NUMBA": "0"}
    off = subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
    x = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)
    on = lowbit.format("float8_e4m3fn").encode(x).tobytes()
    on += np.asarray(lowbit.quantize(x.reshape(512, 512), "int4", group_size=128).codes).tobytes()
    assert off.stdout == on


# ---- decode ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_decode_paths_agree(fmt: FloatFormat) -> None:
    """Compiled and numpy decoders give the same bits for every code, any code dtype, into float32/float64/float16/bfloat16."""
    if fmt.bits <= 16:
        codes = np.arange(1 << fmt.bits, dtype=np.int64)
    else:
        codes = np.random.default_rng(5).integers(0, 1 << fmt.bits, 1 << 16)
    code_dtypes = [np.int64, np.uint64, fmt.code_dtype]
    for cdt in code_dtypes:
        c = codes.astype(cdt)
        for dtype in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
            with np.errstate(over="ignore"):
                fast = fmt.decode(c, dtype)
                with _fast.numpy_only():
                    ref = fmt.decode(c, dtype)
            assert fast.dtype == ref.dtype == np.dtype(dtype)
            assert fast.tobytes() == ref.tobytes(), (fmt.name, cdt, dtype)


def test_decode_shapes_and_dtypes() -> None:
    """Decode keeps the codes' shape (strided, 2-D; 0-d codes give what the numpy path gives) and NaNs come out canonical."""
    f8 = lowbit.format("float8_e4m3fn")
    c = np.arange(256, dtype=np.uint8).reshape(16, 16)[:, ::3]
    out = f8.decode(c)
    assert out.shape == c.shape and out.dtype == np.float32
    with _fast.numpy_only():
        assert out.tobytes() == f8.decode(c).tobytes()
    for name in ("float8_e4m3fn", "bfloat16", "float16", "float8_e8m0fnu", "tf32"):
        fmt = lowbit.format(name)
        for code in (5, np.uint8(5), np.array(7, dtype=np.int64)):
            fast = fmt.decode(code)
            with _fast.numpy_only():
                ref = fmt.decode(code)
            assert type(fast) is type(ref) and np.shape(fast) == np.shape(ref) == ()
            assert np.asarray(fast).tobytes() == np.asarray(ref).tobytes()
    bf = lowbit.format("bfloat16")
    c16 = np.array([[0x3F80, 0xBF80], [0x7FC1, 0xFF81]], dtype=np.uint16)
    out = bf.decode(c16)
    assert out.shape == (2, 2)
    assert out.view(np.uint32).tolist() == [[0x3F800000, 0xBF800000], [0x7FC00000, 0xFFC00000]]


def test_decode_wide_codes_exact() -> None:
    """bfloat16 and TF32 codes decode to float32 by a shift: every non-NaN bfloat16 code is its ml_dtypes value."""
    bf = lowbit.format("bfloat16")
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = bf.decode(codes).view(np.uint32)
    want = codes.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)
    nan = np.isnan(codes.view(ml_dtypes.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(got[~nan], want[~nan])
    np.testing.assert_array_equal(got[nan] & 0x7FFFFFFF, 0x7FC00000)
    tf = lowbit.format("tf32")
    c = np.array([0x3F800 >> 0, 0x7F7FF, 0x00001], dtype=np.uint32)
    np.testing.assert_array_equal(tf.decode(c).view(np.uint32), c << 13)


# ---- code validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "codes"),
    [
        ("float8_e4m3fn", np.array([1, 256], dtype=np.uint16)),
        ("float8_e4m3fn", np.array([1, -1], dtype=np.int8)),
        ("float4_e2m1fn", np.array([3, 16], dtype=np.uint8)),
        ("float6_e3m2fn", np.array([64], dtype=np.uint8)),
        ("bfloat16", np.array([1 << 16], dtype=np.int64)),
    ],
)
def test_codes_out_of_range_still_rejected(name: str, codes: np.ndarray) -> None:
    """The cheaper code validation still rejects every out-of-range code, naming it."""
    with pytest.raises(CodeRangeError, match="out of range"):
        lowbit.format(name).decode(codes)


def test_full_width_codes_skip_no_check() -> None:
    """uint8 codes of an 8-bit format need no range scan and decode every code."""
    f = lowbit.format("float8_e5m2")
    out = f.decode(np.arange(256, dtype=np.uint8))
    assert np.isnan(out).sum() == 6 and np.isinf(out).sum() == 2


# ---- integer formats ------------------------------------------------------------------

INT_FORMATS = [f for f in lowbit.FORMATS.values() if isinstance(f, lowbit.IntFormat)]


@functools.cache
def _int_inputs() -> dict[str, np.ndarray]:
    """Every float16 pattern, half-integers and their neighbours up to 2**33, random
    float32/float64 values over the integer ranges, and huge, infinite and NaN values."""
    rng = np.random.default_rng(11)
    halves = np.arange(-(2**12), 2**12) + 0.5
    big = np.ldexp(rng.random(1 << 12) + 1.0, rng.integers(0, 34, 1 << 12)) + 0.5
    h = np.concatenate([halves, big, -big])
    edges = np.concatenate(
        [h, np.nextafter(h, np.inf), np.nextafter(h, -np.inf), [1e300, -1e300, np.inf,
         -np.inf, np.nan, -np.nan, 0.0, -0.0, 2.0**31, -(2.0**31) - 0.5, 2.0**53]]
    )  # fmt: skip
    with np.errstate(over="ignore"):
        edges32 = edges.astype(np.float32)
    return {
        "float16": np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16),
        "edges64": edges,
        "edges32": edges32,
        "float32": (rng.standard_normal(1 << 17) * 300).astype(np.float32),
        "float64": rng.standard_normal(1 << 16) * 3e9,
    }


@pytest.mark.parametrize("fmt", INT_FORMATS, ids=[f.name for f in INT_FORMATS])
def test_int_encode_paths_agree(fmt: lowbit.IntFormat) -> None:
    """Compiled and numpy integer encoders give identical codes in every mode, clamping or wrapping."""
    for name, x in _int_inputs().items():
        rbits = _random_bits(x.size)
        for mode in ROUNDINGS:
            for sat in (None, True, False):
                kw = {"rounding": mode, "saturate": sat, "nan": "zero"}
                if mode == "stochastic":
                    kw["random_bits"] = rbits
                with np.errstate(invalid="ignore", over="ignore"):
                    fast, ref = _encode_both(fmt, x, **kw)
                _assert_same(fmt, x, fast, ref, f"{name} {mode} saturate={sat}")


def test_int_nan_error_and_speed_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """int encode raises the same NaNPolicyError on both paths, and the compiled path skips round_to_integer."""
    fmt = lowbit.format("int4")
    x = np.array([1.5, np.nan], dtype=np.float32)
    fast, ref = _encode_both(fmt, x)
    assert isinstance(fast, NaNPolicyError)
    _assert_same(fmt, x, fast, ref, "nan")
    from lowbit.formats import ints as intformat

    def fail(*args: object, **kw: object) -> None:
        raise AssertionError("numpy path taken")

    monkeypatch.setattr(intformat, "round_to_integer", fail)
    codes = fmt.encode(np.array([2.5, -2.5, 7.6, -9.0], dtype=np.float32))
    assert codes.tolist() == [2, 0xE, 7, 0x8]


@pytest.mark.parametrize(
    "name", ["float8_e4m3fn", "float4_e2m1fn", "bfloat16", "float16", "float8_e8m0fnu", "int4"]
)
def test_split_across_threads(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large arrays split into pieces on threads encode (every mode, a NaN in the last
    piece raising as it should) and decode exactly as the numpy path on one piece."""
    from lowbit import _parallel

    monkeypatch.setattr(_fast, "_PIECE", 1000)
    monkeypatch.setattr(_parallel, "threads", lambda: 3)
    fmt = lowbit.format(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = (rng.standard_normal(10_001) * 4).astype(np.float32)
    for rounding in ROUNDINGS:
        kw = {"rounding": rounding, "saturate": True}
        if rounding == "stochastic":
            kw["seed"] = 3
        fast, ref = _encode_both(fmt, x, **kw)
        _assert_same(fmt, x, fast, ref, rounding)
    y = x.copy()
    y[-5] = np.nan
    fast, ref = _encode_both(fmt, y)
    _assert_same(fmt, y, fast, ref, "nan")
    codes = fmt.encode(x, saturate=True)
    got = fmt.decode(codes)
    with _fast.numpy_only():
        want = fmt.decode(codes)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_pack4_kernel() -> None:
    """pack4 puts element 0 in the low nibble, as packing.pack; odd counts decline."""
    c = np.random.default_rng(5).integers(0, 16, size=1000).astype(np.uint8)
    got = _fast.pack4(c)
    with _fast.numpy_only():
        want = lowbit.pack(c, 4)
    assert got is not None and np.array_equal(got, want)
    assert _fast.pack4(c[:999]) is None
