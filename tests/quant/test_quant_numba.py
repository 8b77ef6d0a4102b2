"""_fastquant and _parallel: quantize and dequantize give the same codes, scales, zero
points and values with the compiled kernels on several threads as on the numpy path on
one thread, for every small float and value-set format, at every granularity, on data
placed on rounding boundaries (exact ties, their float32 neighbours), tiny and huge
scales, and non-finite inputs."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit import LowbitError, _parallel
from lowbit.codecs import _numba as _fast
from lowbit.errors import UnderflowWarning
from lowbit.quant import _engine as _qengine
from lowbit.quant import _numba as _fastquant
from strategies import CATALOG_FLOATS, granularities, quant_arrays

pytestmark = pytest.mark.skipif(not _fast.HAVE_NUMBA, reason="numba is not installed")

SMALL_FLOATS = [n for n in CATALOG_FLOATS if lowbit.format(n).bits <= 8 and lowbit.format(n).signed]
LAYOUTS: list[dict[str, Any]] = [
    {},
    {"axis": 0},
    {"axis": -1},
    {"group_size": 32},
    {"group_size": 32, "axis": 0},
    {"group_size": 40},  # a ragged last group: two strided views
    {"group_size": 40, "axis": 0},
]


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Chunks of 2048 elements on three threads (one under ``serial()``), so that
    test-sized tensors span many chunks and threads; kernels at any size."""
    monkeypatch.setattr(_qengine, "_CHUNK_FAST", 2048)
    real = _parallel.threads
    monkeypatch.setattr(_parallel, "threads", lambda: 1 if real() == 1 else 3)
    with _fast.kernels_always():  # the default leaves chunks this small to numpy
        yield


def _run(fn: Any) -> Any:
    try:
        return fn()
    except LowbitError as exc:
        return exc


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}")


def _same(x: np.ndarray, fmt: str, **kw: Any) -> lowbit.QuantizedTensor | None:
    """quantize (and dequantize to float32 and float64) agree bit for bit between the
    kernels on threads and the numpy path on one thread; errors agree in type and text."""
    fast = _run(lambda: lowbit.quantize(x, fmt, **kw))
    with _fast.numpy_only(), _parallel.serial():
        ref = _run(lambda: lowbit.quantize(x, fmt, **kw))
    if isinstance(ref, LowbitError):
        assert type(fast) is type(ref) and str(fast) == str(ref), (fmt, kw)
        return None
    assert not isinstance(fast, LowbitError), (fmt, kw, fast)
    assert np.array_equal(fast.codes, ref.codes), (fmt, kw)
    assert np.array_equal(_bits(fast.scale), _bits(ref.scale)), (fmt, kw)
    if ref.zero_point is None:
        assert fast.zero_point is None
    else:
        assert np.array_equal(fast.zero_point, ref.zero_point), (fmt, kw)
    for dtype in (np.float32, np.float64):
        with np.errstate(over="ignore"):  # float64 data beyond float32 dequantizes to inf
            got = fast.dequantize(dtype)
            with _fast.numpy_only(), _parallel.serial():
                want = ref.dequantize(dtype)
        assert np.array_equal(_bits(got), _bits(want)), (fmt, kw, dtype)
    return fast


def _boundaries(fmt: Any, dtype: Any = np.float32) -> np.ndarray:
    """Every value of a format, every midpoint of neighbours, and the ``dtype`` number
    next to each midpoint on both sides (both signs where the format has them)."""
    v = np.unique(fmt.values().astype(np.float64))
    v = v[np.isfinite(v)]
    mids = (v[1:] + v[:-1]) / 2
    m = mids.astype(dtype)
    pts = np.concatenate([
        v.astype(dtype), m, np.nextafter(m, dtype(np.inf)), np.nextafter(m, dtype(-np.inf)),
    ])  # fmt: skip
    return pts[np.isfinite(pts)]


def _tied_rows(
    fmt: Any, width: int, rng: np.random.Generator, dtype: Any = np.float32
) -> np.ndarray:
    """Rows of ``width`` boundary points (shuffled), each row holding the format's
    largest magnitude so that an absmax scale of it makes the quotients exact."""
    pts = _boundaries(fmt, dtype)
    vmax = dtype(np.max(np.abs(fmt.values()[np.isfinite(fmt.values())])))
    n = -(-pts.size // (width - 1))
    body = rng.permutation(np.resize(pts, n * (width - 1))).reshape(n, width - 1)
    return np.concatenate([np.full((n, 1), vmax, dtype=dtype), body], axis=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", SMALL_FLOATS)
@pytest.mark.parametrize("rounding", ["nearest_even", "nearest_away"])
def test_float_formats_on_boundaries(name: str, rounding: str, dtype: Any) -> None:
    """Scaled small floats: exact ties, their neighbours, values and the subnormal range
    of the format give the numpy path's codes, per tensor (long rows), per row, in groups,
    from float32 and from float64 data."""
    fmt = lowbit.format(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = _tied_rows(fmt, 64, rng, dtype)
    for kw in ({}, {"axis": 0}, {"group_size": 64}):
        _same(x, name, rounding=rounding, **kw)
    # column mode: the same rows as columns, a scale per column or per group of rows
    xt = np.ascontiguousarray(x.T)
    for kw in ({"axis": -1}, {"group_size": 64, "axis": 0}):
        _same(xt, name, rounding=rounding, **kw)
    # one long row: the quotient's edge check works per block of a long row
    long = np.concatenate([rng.standard_normal(3000).astype(dtype), x.reshape(-1)])
    _same(long, name, rounding=rounding)
    # MX-like power-of-two group scales keep ties as ties
    _same(x * dtype(2.0**-9), name, rounding=rounding, group_size=64)


@pytest.mark.parametrize(
    "fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "mxint8"]
)
def test_mx_formats_match_numpy(fmt: str) -> None:
    """MX blocks (E8M0 scales from the absmax kernel) give the numpy path's codes."""
    rng = np.random.default_rng(zlib.crc32(fmt.encode()))
    x = rng.standard_normal((48, 256)).astype(np.float32)
    x[0, :64] = 0.0  # an all-zero block and a block with zeros of both signs
    x[1, :32] = -0.0
    x[1, 32:40] = 0.0
    x[2] = np.abs(x[2])
    x[3] = -np.abs(x[3])
    x[4, 100] = 1e30
    x[5] *= np.float32(1e-41)  # float32 subnormals
    elem = lowbit.format(
        {"mxfp4": "fp4_e2m1", "mxint8": "int8"}.get(fmt, fmt[2:].replace("mx", ""))
    )
    pts = _boundaries(elem) if elem.kind != "int" else np.arange(-128, 128, 0.5)
    x[6:6 + -(-pts.size // 256)].reshape(-1)[: pts.size] = pts  # fmt: skip
    _same(x, fmt)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["nf4"])
@pytest.mark.parametrize("rounding", ["nearest_even", "nearest_away"])
def test_valueset_on_boundaries(name: str, rounding: str, dtype: Any) -> None:
    """NF4: midpoints exactly (ties go through the exact codec), the float32/float64
    values beside them (the bins with a midpoint), in blocks of 64 and in long rows."""
    fmt = lowbit.format(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = _tied_rows(fmt, 64, rng, dtype)
    mids = (fmt.values()[1:].astype(np.float64) + fmt.values()[:-1]) / 2
    exact = mids[mids.astype(np.float32) == mids]
    assert exact.size > 0  # the data does hold exact ties
    for kw in ({}, {"group_size": 64, "axis": 0}, {"group_size": 1024}):
        _same(x, name, rounding=rounding, **kw)
    _same(np.ascontiguousarray(x.T), name, rounding=rounding, group_size=64, axis=0)
    _same(np.concatenate([x.reshape(-1), rng.standard_normal(5000).astype(dtype)]), name,
          rounding=rounding, group_size=2048)  # fmt: skip


@pytest.mark.parametrize(
    "fmt", ["int8", "int4", "int3", "int2", "nf4", "fp8_e4m3", "fp4_e2m1", "mxfp4"]
)
def test_every_layout_and_scale_choice(fmt: str) -> None:
    """Random data at each granularity, scale method, scale format and symmetry gives
    the same result on both paths (layouts the kernels do not take fall back)."""
    rng = np.random.default_rng(zlib.crc32(fmt.encode()) + 1)
    x = rng.standard_normal((40, 96)).astype(np.float32)
    layouts = [{}] if fmt.startswith("mx") else LAYOUTS
    x64 = x.astype(np.float64) * (1 + 2.0**-30)  # not float32 values
    for kw in layouts:
        _same(x, fmt, **kw)
        _same(x.reshape(4, 10, 96), fmt, **kw)
        _same(x64, fmt, **kw)
        if not fmt.startswith("mx"):
            _same(x, fmt, scale_method="percentile", percentile=90.0, **kw)
            _same(x, fmt, scale_format="bfloat16", **kw)
        if fmt.startswith("int"):
            _same(x, fmt, symmetric=False, **kw)
            _same(x, fmt, restricted_range=True, **kw)


@pytest.mark.parametrize("fmt", ["int8", "nf4", "fp8_e4m3", "fp8_e5m2", "mxfp4"])
def test_extreme_scales_and_nonfinite(fmt: str) -> None:
    """Subnormal and huge inputs (tiny scales the value-set kernel declines, quotients
    that overflow float32) and NaN/inf under both NaN policies agree."""
    rng = np.random.default_rng(zlib.crc32(fmt.encode()) + 2)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    # E8M0 stops at 2**-127: an MX block of 1e-42 values flushes to zeros, and says so
    with pytest.warns(UnderflowWarning) if fmt == "mxfp4" else contextlib.nullcontext():
        _same(x * np.float32(1e-42), fmt)
    with pytest.warns(UnderflowWarning):  # the scales underflow: every value becomes 0
        _same(x.astype(np.float64) * 1e-300, fmt)
    _same(x.astype(np.float64) * 1e300, fmt)  # scales overflow: the same error on both paths
    # a clip far below an outlier: the float32 quotient overflows to infinity, and saturates
    y = np.full((4, 64), 1e-3, dtype=np.float32)
    y[0, 0], y[1, 5] = 3e38, -3e38
    _same(y, fmt, scale_method="percentile", percentile=50.0)
    _same(y, fmt, scale_method="percentile", percentile=50.0, axis=0)
    _same(x / np.abs(x).max() * np.float32(3e38), fmt)
    y = x.copy()
    y[0, 3] = np.nan
    y[5, 7] = np.inf
    y[9, 1] = -np.inf
    for nan in ("raise", "propagate"):
        _same(y, fmt, nan=nan)
        if not fmt.startswith("mx"):
            _same(y, fmt, nan=nan, axis=0)


@pytest.mark.parametrize("rounding", ["nearest_even", "nearest_away"])
@pytest.mark.parametrize("fmt", ["int8", "int4", "int3", "int2"])
def test_quantize_int_kernel_matches_numpy(fmt: str, rounding: str) -> None:
    """lowbit.quantize gives the same codes and scales with and without the int kernel."""
    rng = np.random.default_rng(zlib.crc32(f"{fmt}{rounding}".encode()))
    qmax = {"int8": 127, "int4": 7, "int3": 3, "int2": 1}[fmt]
    # exact ties: each row's absmax is qmax, so s = 1 and x = k + 1/2 is a true tie
    ties = (rng.integers(-2 * qmax, 2 * qmax + 1, size=(40, 96)) / 2).astype(np.float32)
    ties[:, 0] = qmax
    s = np.abs(ties).max(axis=1, keepdims=True) / qmax
    assert (np.abs(ties / s % 1) == 0.5).sum() > 100  # the data does hold ties
    near = (rng.integers(-255, 256, size=(40, 96)) / np.float32(127)).astype(np.float32)
    data = [rng.standard_normal((33, 128)).astype(np.float32) * 1e-3, ties, near]
    for x in data:
        for kw in ({"axis": 0}, {"axis": -1}, {"group_size": 32}, {}):
            _same(x, fmt, rounding=rounding, **kw)
        _same(x.reshape(-1, 4, 8), fmt, rounding=rounding, axis=1)


def test_minmax_kernel_matches_numpy() -> None:
    """scales.minmax gives the same bits with and without the min/max kernel, also for
    rows with zeros of either sign, infinities and NaNs."""
    from lowbit.quant.scales import minmax

    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    x[1] = 0.0
    x[2] = -0.0
    x[3, ::2] = -0.0
    x[4] = np.abs(x[4])
    x[4, 5] = 0.0
    x[5, 3] = np.inf
    x[6, 7] = -np.inf
    x[7, 1] = np.nan
    x[8] = 2.5  # a constant row
    for V in (x, x[9:], x.reshape(8, 8, 32), x.reshape(-1, 2)):
        got = minmax(V, (V.ndim - 1,))
        with _fast.numpy_only():
            want = minmax(V, (V.ndim - 1,))
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert np.array_equal(g.view(np.uint64), w.view(np.uint64))
    assert _fastquant.row_minmax(x[9:]) is not None  # the kernel does run on plain rows


@pytest.mark.parametrize("fmt", ["mxfp4", "mxint8", "nf4", "int4", "fp8_e4m3"])
def test_quantize_block_formats_match_numpy(fmt: str) -> None:
    """Block formats quantize to the same codes and scales with and without the kernels."""
    rng = np.random.default_rng(zlib.crc32(fmt.encode()))
    x = rng.standard_normal((16, 256)).astype(np.float32)
    x[0, :64] = 0.0
    x[1] = np.abs(x[1])
    x[2, 100] = 1e30
    for kw in ({}, {"group_size": 32}):
        _same(x, fmt, **kw)


def test_absmax_kernel() -> None:
    """row_absmax: NaN rows give NaN, infinities inf, zeros of either sign 0, and one
    long row (split across threads) the same maximum."""
    x = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    x[1] = -0.0
    x[2, 3] = np.nan
    x[3, 4] = -np.inf
    x[4, 5] = -7.5
    got = _fastquant.row_absmax(x)
    assert got is not None and got.shape == (8, 1) and got.dtype == np.float64
    assert got[1, 0] == 0.0 and np.isnan(got[2, 0]) and got[3, 0] == np.inf
    assert got[4, 0] == 7.5
    fine = [0, 4, 5, 6, 7]
    assert np.array_equal(got[fine, 0], np.abs(x[fine]).max(axis=1))
    long = np.random.default_rng(4).standard_normal(5 * _fastquant._SEGMENT + 3).astype(np.float32)
    long[-1] = -9.0
    assert _fastquant.row_absmax(long)[0] == 9.0  # type: ignore[index]
    y = x.astype(np.float64) * (1 + 2.0**-40)
    got64 = _fastquant.row_absmax(y)
    assert got64 is not None and np.isnan(got64[2, 0]) and got64[3, 0] == np.inf
    assert np.array_equal(got64[fine, 0], np.abs(y[fine]).max(axis=1))


def test_map_chunks_order_and_errors() -> None:
    """map_chunks keeps the order of its items and raises the earliest band's error."""
    assert _parallel.map_chunks(lambda i: i * i, list(range(37))) == [i * i for i in range(37)]

    def boom(i: int) -> int:
        if i in (5, 30):
            raise ValueError(f"item {i}")
        return i

    with pytest.raises(ValueError, match="item 5"):
        _parallel.map_chunks(boom, list(range(37)))
    with _parallel.serial():
        assert _parallel.threads() == 1


def test_the_kernels_do_run() -> None:
    """On the layouts they serve, the kernels return codes (not None: a fallback)."""
    x = np.random.default_rng(6).standard_normal((8, 64)).astype(np.float32)
    s = np.abs(x).max(axis=1, keepdims=True).astype(np.float32)
    assert (
        _fastquant.scaled_valueset_codes(x, s, lowbit.format("nf4"), _qengine.Rounding.NEAREST_EVEN)
        is not None
    )
    assert _fastquant.scaled_float_codes(x, s / 448, lowbit.format("fp8_e4m3"), 0) is not None
    assert _fastquant.scaled_int_codes(x, s / 127, False, -128, 127, 8) is not None
    cols = np.full((1, 64), 0.5, dtype=np.float32)  # column mode: a scale per column
    got = _fastquant.scaled_valueset_codes(
        x, cols, lowbit.format("nf4"), _qengine.Rounding.NEAREST_EVEN
    )
    assert got is not None
    assert _fastquant.scaled_int_codes(x, cols, False, -128, 127, 8) is None  # numpy's is faster
    assert _fastquant.scaled_int_codes(x[:, ::2], s / 127, False, -128, 127, 8) is None


def test_nested_map_chunks_runs() -> None:
    """map_chunks inside a map_chunks worker runs serially instead of waiting on its pool."""
    inner = lambda i: sum(_parallel.map_chunks(lambda j: i * j, list(range(10))))  # noqa: E731
    assert _parallel.map_chunks(inner, list(range(8))) == [45 * i for i in range(8)]


@pytest.mark.parametrize(
    ("fmt", "kernel", "axis"),
    [
        ("int4", "scaled_int_codes", -1),
        ("nf4", "scaled_valueset_codes", -1),
        ("fp4_e2m1", "scaled_float_codes", -1),
        ("nf4", "scaled_valueset_codes", 0),  # column mode
    ],
)
def test_kernels_take_ragged_groups(
    fmt: str, kernel: str, axis: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups of 128 along rows of 576 (SmolLM2's width: a ragged last group of 64) go
    through the kernels as strided row views (NF4 along columns too, in column mode), and
    agree with the numpy path."""
    calls: list[bool] = []
    real = getattr(_fastquant, kernel)

    def spy(*args: Any) -> Any:
        out = real(*args)
        if _fast.enabled():  # not the numpy reference run
            calls.append(out is not None)
        return out

    monkeypatch.setattr(_fastquant, kernel, spy)
    x = np.random.default_rng(8).standard_normal((96, 576)).astype(np.float32)
    _same(x if axis == -1 else np.ascontiguousarray(x.T), fmt, group_size=128, axis=axis)
    assert calls and all(calls)


def test_errstate_reaches_worker_threads() -> None:
    """The caller's np.errstate holds in the chunks other threads run: float64 data beyond
    float32 (within E8M0's range) dequantizes to inf without an overflow warning."""
    x = np.random.default_rng(9).uniform(-6e38, 6e38, (64, 256))
    qt = lowbit.quantize(x, "mxfp4")
    with np.errstate(over="ignore"):
        out = qt.dequantize()
    assert np.isinf(out[:8]).any() and np.isinf(out[-8:]).any()  # first and last bands


@settings(max_examples=150, deadline=None)
@given(x=quant_arrays(max_side=40), data=st.data())
def test_any_tensor_any_layout(x: np.ndarray, data: st.DataObject) -> None:
    """Random tensors (normal, sparse, constant, integer-valued, an outlier; any
    magnitude; float32 or float64) at a random granularity and nearest rounding give the
    same codes, scales and values with the kernels on threads as on the numpy path."""
    fmt = data.draw(st.sampled_from(["int8", "int4", "int3", "nf4", "fp8_e4m3", "fp8_e5m2",
                                     "fp6_e2m3", "fp4_e2m1"]))  # fmt: skip
    kw = data.draw(granularities(x.shape))
    kw["rounding"] = data.draw(st.sampled_from(["nearest_even", "nearest_away"]))
    if data.draw(st.booleans()):
        x = x.astype(np.float64) * (1 + 2.0**-30)
    _same(x, fmt, **kw)


@pytest.mark.parametrize("rounding", ["nearest_even", "nearest_away"])
def test_float64_near_ties_round_on_the_exact_quotient(rounding: str) -> None:
    """float64 data at and one ulp beside k + 1/2 times the scale: the division can land
    exactly half way when the exact quotient is not (and the reverse), and the codes of
    both paths are those of the exact rational quotient."""
    from fractions import Fraction

    rng = np.random.default_rng(10)
    s32 = rng.uniform(0.5, 2.0, size=(24, 1)).astype(np.float32)
    k = rng.integers(-127, 127, size=(24, 90)) + 0.5
    mid = k * s32.astype(np.float64)  # exact in float64
    x = np.concatenate(
        [127 * s32.astype(np.float64), mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)],
        axis=1,
    )
    want = np.empty(x.shape, dtype=np.int64)
    for (i, j), v in np.ndenumerate(x):
        q = Fraction(float(v)) / Fraction(float(s32[i, 0]))
        fl = q.numerator // q.denominator
        frac = q - fl
        if frac != Fraction(1, 2):
            r = fl + (frac > Fraction(1, 2))
        elif rounding == "nearest_away":
            r = fl + 1 if q > 0 else fl
        else:
            r = fl + fl % 2
        want[i, j] = min(max(r, -128), 127)
    qt = _same(x, "int8", axis=0, rounding=rounding)
    assert qt is not None
    assert np.array_equal(qt.scale, s32)  # the quotients are the ones built above
    np.testing.assert_array_equal(qt.unpack(), want)


def test_map_chunks_waits_for_every_band() -> None:
    """When a later band fails, map_chunks raises only after the other bands finished."""
    import time

    done: list[int] = []

    def work(i: int) -> int:
        if i == 10:
            raise ValueError("band two")
        if i >= 20:
            time.sleep(0.01)
            done.append(i)
        return i

    with pytest.raises(ValueError, match="band two"):
        _parallel.map_chunks(work, list(range(30)))
    assert sorted(done) == list(range(20, 30))
