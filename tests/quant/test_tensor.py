"""lowbit.quant.tensor: quantize/dequantize at every granularity, scales, storage, bad input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit import LowbitError
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.scheme import Scheme
from lowbit.quant.tensor import quantize, quantize_dynamic
from strategies import QUANT_INTS, granularities, quant_arrays

# ---- the worked example ------------------------------------------------------------


def test_worked_example_int8() -> None:
    """[-0.5, 0.3, 1.2, -2.1] to int8: scale 2.1/127, codes [-30, 18, 73, -127]."""
    qt = quantize([-0.5, 0.3, 1.2, -2.1], "int8")
    assert qt.scale.dtype == np.float32
    assert qt.scale.reshape(-1)[0] == np.float32(2.1 / 127)
    np.testing.assert_array_equal(qt.unpack(), [-30, 18, 73, -127])
    assert qt.unpack().dtype == np.int8


def test_worked_example_int4() -> None:
    """To int4: scale 0.3 and codes [-2, 1, 4, -7] (-0.5/0.3 = -1.667 rounds to -2)."""
    qt = quantize([-0.5, 0.3, 1.2, -2.1], "int4")
    assert qt.scale.reshape(-1)[0] == np.float32(0.3)
    np.testing.assert_array_equal(qt.unpack(), [-2, 1, 4, -7])
    assert qt.codes.tobytes() == bytes([0x1E, 0x94])  # two's complement nibbles, low first
    np.testing.assert_array_equal(
        qt.dequantize(np.float64), np.array([-2, 1, 4, -7]) * np.float64(np.float32(0.3))
    )


# ---- integer properties ------------------------------------------------------------


@st.composite
def int_cases(draw: st.DrawFn) -> tuple[np.ndarray, dict]:
    x = draw(quant_arrays())
    kw = draw(granularities(x.shape))
    fmt = draw(st.sampled_from(QUANT_INTS))
    kw["symmetric"] = draw(st.booleans())
    kw["restricted_range"] = fmt.startswith("int") and draw(st.booleans())
    kw["scale_method"] = draw(st.sampled_from(["absmax", "absmax", "percentile", "meanstd", "mse"]))
    kw["scale_format"] = draw(st.sampled_from(["float32", "float16", "bfloat16", "e8m0"]))
    return x, {"fmt": fmt, **kw}


def _quantize_any(x: np.ndarray, fmt: str, **kw: Any) -> QuantizedTensor | None:
    """``quantize`` for the property tests, whose data spans 2**-24..2**31: None where a
    float16 scale would overflow (a LowbitError, checked to be one the data calls for);
    data that underflows float16 scales to all zeros is quantized without the warning."""
    try:
        return quantize(x, fmt, underflow="ignore", **kw)
    except LowbitError as exc:
        if kw.get("scale_format") != "float16" or "overflows float16" not in str(exc):
            raise
        # a scale above 65504 needs a clip range above 65504 wide (at least 3 integer steps)
        assert np.abs(x.astype(np.float64)).max() > 65504 / 2
        return None


def _expand(qt: QuantizedTensor, a: np.ndarray) -> np.ndarray:
    """Per-element copy of a scale-shaped array (through the tensor's own layout)."""
    lay = qt.layout
    P, L, Q = lay.pqr
    out = np.empty((P, L, Q), dtype=np.float64)
    for i, part in enumerate(lay.parts):
        v = np.broadcast_to(
            lay.scale4(a.astype(np.float64), i), lay.view(np.empty(qt.shape), part).shape
        )
        out[:, part.start : part.stop, :] = v.reshape(P, part.stop - part.start, Q)
    return out.reshape(qt.shape)


@settings(max_examples=120, deadline=None)
@given(case=int_cases())
def test_int_error_within_half_a_step_inside_the_clip_range(case: tuple) -> None:
    """|x - deq(q(x))| <= scale/2 wherever x is inside the clipping range; codes in range."""
    x, kw = case
    fmt = lowbit.format(kw.pop("fmt"))
    qt = _quantize_any(x, fmt.name, **kw)
    if qt is None:
        return
    q = qt.unpack().astype(np.int64)
    lo = -int(fmt.max) if kw["restricted_range"] else int(fmt.min)
    assert q.min() >= lo and q.max() <= int(fmt.max)
    s = _expand(qt, qt.scale)
    zp = _expand(qt, qt.zero_point) if qt.zero_point is not None else np.zeros_like(s)
    deq = qt.dequantize(np.float64)
    np.testing.assert_array_equal(deq, (q - zp) * s)  # exact in float64
    inside = (x >= (lo - zp) * s) & (x <= (int(fmt.max) - zp) * s)
    err = np.abs(x.astype(np.float64) - deq)
    assert np.all(err[inside] <= s[inside] / 2)
    outside = ~inside  # clipped values sit on the end of the range
    assert np.all(np.isin(q[outside], [lo, int(fmt.max)]))
    if qt.zero_point is not None:  # 0.0 is exact
        assert np.all(deq[x == 0] == 0)


@settings(max_examples=60, deadline=None)
@given(x=quant_arrays(), data=st.data())
def test_codes_are_the_exact_rounding_of_x_over_the_stored_scale(x: np.ndarray, data) -> None:
    """Codes = clamp(round_half_even(x / s) + zp) with the stored (rounded) scale and the
    float64 quotient, which is exact for float32 inputs."""
    kw = data.draw(granularities(x.shape))
    sf = data.draw(st.sampled_from(["float32", "float16", "bfloat16", "e8m0"]))
    sym = data.draw(st.booleans())
    qt = _quantize_any(x, "int4", scale_format=sf, symmetric=sym, **kw)
    if qt is None:
        return
    s = _expand(qt, qt.scale)
    zp = _expand(qt, qt.zero_point) if qt.zero_point is not None else 0.0
    want = np.clip(np.rint(x.astype(np.float64) / s) + zp, -8, 7)
    np.testing.assert_array_equal(qt.unpack(), want)
    if sf != "float32":  # the scale is representable in its format
        f = lowbit.format(sf)
        np.testing.assert_array_equal(f.round(qt.scale.astype(np.float64)), qt.scale)


def test_float32_quotient_ties_are_resolved_exactly(rng: np.random.Generator) -> None:
    """Where x/s in float32 rounds onto k+0.5 but the exact quotient does not, the code
    follows the exact quotient (the float32 fast path re-does those in float64)."""
    found = []
    while len(found) < 20:
        s = np.float32(rng.uniform(0.5, 1.0)) * np.float32(2.0 ** rng.integers(-10, 10))
        k = int(rng.integers(-100, 100))
        x0 = np.float32((k + 0.5) * np.float64(s))
        for x in (np.nextafter(x0, np.float32(np.inf)), np.nextafter(x0, np.float32(-np.inf)), x0):
            t32 = np.float32(x) / s
            t64 = np.float64(x) / np.float64(s)
            if t32 - np.floor(t32) == 0.5 and t64 - np.floor(t64) != 0.5:
                found.append((np.float32(x), s))
    xs = np.array([f[0] for f in found], dtype=np.float32)
    ss = np.array([f[1] for f in found], dtype=np.float32)
    # one group per value: each gets its own scale; force the scale by adding the absmax
    amax = ss * 127
    data = np.stack([xs, amax], axis=1)  # group of 2 along the last axis
    qt = quantize(data, "int8", group_size=2)
    np.testing.assert_array_equal(qt.scale.reshape(-1), ss)
    want = np.rint(xs.astype(np.float64) / ss.astype(np.float64))
    np.testing.assert_array_equal(qt.unpack()[:, 0], want)
    assert np.any(want != np.rint(xs / ss))  # float32 division alone would differ


def test_float64_input_ties_use_exact_rationals() -> None:
    """float64 inputs: a quotient that is a tie only after float64 rounding is not one."""
    s = np.float32(0.1)
    x = math.nextafter(2.5 * float(s), math.inf)  # just above the tie
    qt = quantize(np.array([x, 127 * float(s)]), "int8")
    assert qt.scale.reshape(-1)[0] == s
    assert qt.unpack()[0] == 3


# ---- stochastic rounding -----------------------------------------------------------


def test_stochastic_rounding_is_unbiased() -> None:
    """E[deq(q(x))] = x for stochastic rounding (within 5 standard errors), seeded."""
    n = 200_000
    x = np.full(n, 0.3, dtype=np.float32)
    x[0] = 1.0  # scale = 1/127: x/s = 38.1 sits between 38 and 39
    qt = quantize(x, "int8", rounding="stochastic", seed=7)
    deq = qt.dequantize(np.float64)[1:]
    s = float(qt.scale.reshape(-1)[0])
    p = 0.3 / s - math.floor(0.3 / s)
    se = s * math.sqrt(p * (1 - p) / (n - 1))
    assert abs(deq.mean() - 0.3) < 5 * se
    assert set(np.unique(qt.unpack()[1:])) == {38, 39}
    again = quantize(x, "int8", rounding="stochastic", seed=7)
    np.testing.assert_array_equal(again.codes, qt.codes)


def test_stochastic_nf4_and_fp4_unbiased() -> None:
    """Stochastic rounding through value-set and float codecs is unbiased too."""
    n = 100_000
    for fmt in ("nf4", "fp4"):
        x = np.full(n, 0.3, dtype=np.float32)
        x[::64] = 1.0 if fmt == "nf4" else 6.0  # pins absmax per block of 64
        kw = {} if fmt == "nf4" else {"group_size": 64}
        qt = quantize(x, fmt, rounding="stochastic", seed=1, **kw)
        keep = np.ones(n, bool)
        keep[::64] = False
        deq = qt.dequantize(np.float64)[keep]
        assert abs(deq.mean() - 0.3) < 5 * deq.std() / math.sqrt(keep.sum())


# ---- granularity -------------------------------------------------------------------


def test_per_channel_scales_on_any_axis(rng: np.random.Generator) -> None:
    """axis=a: one scale per index along a, from the absmax over every other axis."""
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    for axis in (0, 1, 2, -1):
        qt = quantize(x, "int8", axis=axis)
        shape = [1, 1, 1]
        shape[axis] = x.shape[axis]
        assert qt.scale.shape == tuple(shape)
        other = tuple(i for i in range(3) if i != axis % 3)
        want = (np.max(np.abs(x), axis=other, keepdims=True).astype(np.float64) / 127).astype(
            np.float32
        )
        np.testing.assert_array_equal(qt.scale, want)


def test_groups_along_an_axis_with_a_ragged_last_group(rng: np.random.Generator) -> None:
    """group_size=G along axis: ceil(L/G) scales per line; the last group uses its own values."""
    x = rng.standard_normal((4, 10)).astype(np.float32)
    qt = quantize(x, "int4", group_size=4)
    assert qt.scale.shape == (4, 3)
    last = np.max(np.abs(x[:, 8:]), axis=1).astype(np.float64) / 7
    np.testing.assert_array_equal(qt.scale[:, 2], last.astype(np.float32))
    qt0 = quantize(x, "int4", group_size=2, axis=0)
    assert qt0.scale.shape == (2, 10)
    with pytest.raises(LowbitError, match="does not divide"):
        quantize(x, "int4", group_size=4, pad=False)


def test_ragged_groups_dequantize_exactly(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a ragged last group (two views of the tensor, decoded a few rows at a time),
    dequantize is code * its group's scale, rounded once to float32, at every element."""
    from lowbit.quant import _engine as _qengine

    monkeypatch.setattr(_qengine, "_CHUNK_NUMPY", 64)  # several row bands
    for shape, axis, zp in (((37, 10), -1, False), ((10, 37), 0, False), ((37, 10), -1, True)):
        x = rng.standard_normal(shape).astype(np.float32)
        qt = quantize(x, "int4", group_size=4, axis=axis, symmetric=not zp)
        L = shape[axis]
        s = np.repeat(qt.scale, 4, axis=axis).take(np.arange(L), axis=axis)
        q = qt.unpack().astype(np.float32)
        if zp:
            q = q - np.repeat(qt.zero_point, 4, axis=axis).take(np.arange(L), axis=axis)
        want = (q.astype(np.float32) * s).astype(np.float32)
        np.testing.assert_array_equal(qt.dequantize().view(np.uint32), want.view(np.uint32))


def test_dynamic_quantization_is_per_row(rng: np.random.Generator) -> None:
    """quantize_dynamic: one absmax scale per token (row), for any leading dims."""
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    qt = quantize_dynamic(x)
    assert qt.scale.shape == (2, 3, 1)
    want = (np.max(np.abs(x), axis=-1, keepdims=True).astype(np.float64) / 127).astype(np.float32)
    np.testing.assert_array_equal(qt.scale, want)


def test_scheme_object_and_options_agree(rng: np.random.Generator) -> None:
    """quantize(x, Scheme(...)) == quantize(x, name, **same options); mixing is an error."""
    x = rng.standard_normal((8, 64)).astype(np.float32)
    s = Scheme(format="int4", group_size=32, symmetric=False)
    a = quantize(x, s)
    c = quantize(x, "int4", group_size=32, symmetric=False)
    assert c.codes.tobytes() == a.codes.tobytes()
    np.testing.assert_array_equal(c.scale, a.scale)
    with pytest.raises(LowbitError, match="either a Scheme or options"):
        quantize(x, s, group_size=64)


# ---- scale methods -----------------------------------------------------------------


def test_mse_clipping_is_no_worse_than_absmax(rng: np.random.Generator) -> None:
    """MSE-optimal clipping (ratio 1.0 is among the candidates) never loses to absmax."""
    x = rng.standard_t(3, (64, 256)).astype(np.float32)
    for fmt, kw in (("int4", {"group_size": 64}), ("int4", {"group_size": 64, "symmetric": False}),
                    ("nf4", {}), ("fp4", {"axis": 0}), ("int8", {})):  # fmt: skip
        e_abs = lowbit.error(x, quantize(x, fmt, **kw))["mse"]
        e_mse = lowbit.error(x, quantize(x, fmt, scale_method="mse", **kw))["mse"]
        assert e_mse <= e_abs * 1.001, fmt


def test_percentile_and_meanstd_clip(rng: np.random.Generator) -> None:
    """percentile p clips about (100-p)% of |x|; meanstd clips at |mean| + k·std."""
    x = rng.standard_normal(100_000).astype(np.float32)
    qt = quantize(x, "int8", scale_method="percentile", percentile=99.0)
    clip = float(qt.scale.reshape(-1)[0]) * 127
    assert clip == pytest.approx(np.percentile(np.abs(x), 99.0), rel=1e-6)
    qt = quantize(x, "int8", scale_method="meanstd", k_std=2.0)
    want = abs(x.astype(np.float64).mean()) + 2 * x.astype(np.float64).std()
    assert float(qt.scale.reshape(-1)[0]) * 127 == pytest.approx(want, rel=1e-6)


def test_scaled_float_formats(rng: np.random.Generator) -> None:
    """FP8/FP4: scale = amax / fmt.max, codes = fmt.encode(x / s, saturate=True)."""
    x = rng.standard_normal((16, 32)).astype(np.float32)
    for name in ("fp8_e4m3", "fp8_e5m2", "fp4", "fp6_e3m2"):
        fmt = lowbit.format(name)
        qt = quantize(x, name, group_size=16)
        s = _expand(qt, qt.scale)
        np.testing.assert_array_equal(
            qt.unpack(), fmt.encode(x.astype(np.float64) / s, saturate=True)
        )
        assert np.max(np.abs(qt.dequantize())) <= np.max(np.abs(x))


def test_binary_and_ternary_mean_abs_scales() -> None:
    """Binary: sign with scale mean|x| (XNOR-Net); ternary: TWN threshold 0.7·mean|x|."""
    x = np.array([0.1, -0.2, 0.9, -1.6, 0.0, 0.4], dtype=np.float32)
    qb = quantize(x, "binary")
    assert qb.scale.reshape(-1)[0] == np.float32(np.abs(x.astype(np.float64)).mean())
    np.testing.assert_array_equal(qb.dequantize() > 0, x >= 0)
    qt = quantize(x, "ternary")
    delta = 0.7 * np.abs(x.astype(np.float64)).mean()  # 0.373...
    above = np.abs(x) > delta
    assert qt.scale.reshape(-1)[0] == np.float32(np.abs(x[above]).astype(np.float64).mean())
    np.testing.assert_array_equal(qt.unpack(), np.where(above, np.sign(x) + 1, 1))
    assert qt.bits_per_value == (2 + 4) * 8 / 6  # 12 bits of codes in 2 bytes + fp32 scale


# ---- NF4 ---------------------------------------------------------------------------


def test_nf4_codes_follow_the_published_table(rng: np.random.Generator) -> None:
    """NF4 codes index the QLoRA table: table values * absmax map to their own index, and
    random data to the nearest entry of x/absmax (blocks of 64)."""
    from lowbit.formats.catalog import NF4_TABLE

    table = np.array(NF4_TABLE)
    block = np.tile(table, 4)  # 64 values, absmax 1
    qt = quantize(block.astype(np.float32) * 3.0, "nf4")
    np.testing.assert_array_equal(qt.unpack(), np.tile(np.arange(16), 4))
    x = rng.standard_normal(64 * 50).astype(np.float32)
    qt = quantize(x, "nf4")
    t = x.reshape(-1, 64).astype(np.float64) / qt.scale.reshape(-1, 1)
    want = np.argmin(np.abs(t[..., None] - table), axis=-1)
    np.testing.assert_array_equal(qt.unpack().reshape(-1, 64), want)
    np.testing.assert_array_equal(qt.scale.reshape(-1), np.max(np.abs(x.reshape(-1, 64)), axis=1))


def test_nf4_double_quantization(rng: np.random.Generator) -> None:
    """Double quant keeps the codes, stores 8-bit scales (blocks of 256) + offset, and
    costs 4 + 8/64 + 32/(64*256) bits; dequantized scales stay close."""
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    plain = quantize(x, "nf4")
    dq = quantize(x, "nf4", double_quant=True)
    assert dq.codes.tobytes() == plain.codes.tobytes()
    assert dq.bits_per_value == pytest.approx(4 + 8 / 64 + 32 / (64 * 256), abs=2e-4)
    np.testing.assert_allclose(dq.scale, plain.scale, rtol=0.02)
    arrays, meta = dq.to_arrays()
    assert arrays["scale_codes"].dtype == np.uint8 and arrays["scale_codes"].size == 4096
    assert arrays["scale_absmax"].size == 16
    back = QuantizedTensor.from_arrays(arrays, meta)
    np.testing.assert_array_equal(back.dequantize(), dq.dequantize())


@pytest.mark.torch
def test_dynamic_map_matches_bitsandbytes_definition() -> None:
    """The 8-bit dynamic map equals bitsandbytes' create_dynamic_map() built with torch."""
    torch = pytest.importorskip("torch")
    from lowbit.quant.nf4 import dynamic_map

    data: list[float] = []
    for i in range(7):
        b = torch.linspace(0.1, 1, 2**i + 1)
        means = (b[:-1] + b[1:]) / 2.0
        data += ((10 ** (-(7 - 1) + i)) * means).tolist()
        data += (-(10 ** (-(7 - 1) + i)) * means).tolist()
    data += [0.0, 1.0]
    want = torch.tensor(sorted(data), dtype=torch.float32).numpy()
    np.testing.assert_array_equal(dynamic_map().view(np.uint32), want.view(np.uint32))


def _bnb_nf4(torch: Any, x: np.ndarray, dq: bool) -> tuple[Any, Any, np.ndarray]:
    """bitsandbytes' CPU quantize_4bit(nf4, 64) of flat ``x``: (packed, state, codes in
    element order; it puts the first element of a byte in the high nibble)."""
    F = pytest.importorskip("bitsandbytes.functional")
    q, st = F.quantize_4bit(
        torch.from_numpy(x), blocksize=64, quant_type="nf4", compress_statistics=dq
    )
    b = q.reshape(-1).numpy()
    return q, st, np.stack([b >> 4, b & 15], axis=1).reshape(-1)[: x.size]


@pytest.mark.torch
@pytest.mark.parametrize("n", [256 * 1024, 300 * 448, 700])
def test_nf4_matches_bitsandbytes(n: int, rng: np.random.Generator) -> None:
    """bitsandbytes' own quantize_4bit / dequantize_4bit (nf4, blocks of 64, CPU) give
    lowbit's codes, block absmax and dequantized values bit for bit (a ragged last block too)."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal(n).astype(np.float32)
    q, st, codes = _bnb_nf4(torch, x, dq=False)
    ours = quantize(x, "nf4")
    np.testing.assert_array_equal(ours.unpack(), codes)
    np.testing.assert_array_equal(ours.scale.view(np.uint32), st.absmax.numpy().view(np.uint32))
    F = pytest.importorskip("bitsandbytes.functional")
    theirs = F.dequantize_4bit(q, st).numpy().reshape(-1)
    np.testing.assert_array_equal(ours.dequantize().view(np.uint32), theirs.view(np.uint32))


@pytest.mark.torch
def test_nf4_double_quant_against_bitsandbytes(rng: np.random.Generator) -> None:
    """With double quantization (compress_statistics) the NF4 codes, the per-256 absmax and
    the offset agree with bitsandbytes (the offset to an ulp: it takes torch's float32
    mean, lowbit the exactly rounded one); the 8-bit scale codes agree on >= 99 % of
    blocks, and where they differ lowbit's map entry is the nearer one (bitsandbytes' CPU
    search is not exactly nearest)."""
    torch = pytest.importorskip("torch")
    from lowbit.quant.nf4 import dynamic_map

    x = rng.standard_normal(512 * 1024).astype(np.float32)
    _, st, codes = _bnb_nf4(torch, x, dq=True)
    ours = quantize(x, "nf4", double_quant=True)
    np.testing.assert_array_equal(ours.unpack(), codes)
    arrays, _ = ours.to_arrays()
    c8, a2 = arrays["scale_codes"].reshape(-1), arrays["scale_absmax"].reshape(-1)
    off = np.float32(arrays["scale_offset"][0])
    b_off = float(st.offset)
    b_a2 = st.state2.absmax.numpy()
    np.testing.assert_allclose(a2, b_a2, rtol=1e-6)
    assert float(off) == pytest.approx(b_off, rel=1e-6)
    b_c8 = st.absmax.numpy().reshape(-1)
    differ = np.flatnonzero(c8 != b_c8)
    assert differ.size <= 0.01 * b_c8.size
    plain = quantize(x, "nf4").scale.reshape(-1)
    resid = (plain - off).astype(np.float32).astype(np.float64)
    v = resid / a2.astype(np.float64)[np.arange(plain.size) // 256]
    m = dynamic_map().astype(np.float64)
    mine = np.abs(m[c8[differ]] - v[differ])
    theirs = np.abs(m[b_c8[differ]] - v[differ])
    assert np.all(mine <= theirs + 1e-7)


# ---- storage -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(x=quant_arrays(), data=st.data())
def test_save_load_identity(x: np.ndarray, data) -> None:
    """from_arrays(to_arrays(qt)) has the same codes, scales, zero points and values."""
    fmt = data.draw(
        st.sampled_from(
            ["int4", "int8", "uint3", "nf4", "fp8_e4m3", "fp6_e2m3", "mxfp4", "mxint8", "ternary"]
        )
    )
    kw = {} if fmt.startswith("mx") else data.draw(granularities(x.shape))
    if fmt in ("int4", "int8", "uint3"):
        kw["symmetric"] = data.draw(st.booleans())
    if not fmt.startswith("mx"):
        kw["scale_format"] = data.draw(st.sampled_from(["float32", "float16", "bfloat16", "e8m0"]))
    qt = _quantize_any(x, fmt, **kw)
    if qt is None:
        return
    prefix = data.draw(st.sampled_from(["", "layer.0.weight."]))
    arrays, meta = qt.to_arrays(prefix)
    import json

    meta = json.loads(json.dumps(meta))
    assert sum(a.nbytes for a in arrays.values()) == qt.nbytes
    assert all(k.startswith(prefix) for k in arrays)
    back = QuantizedTensor.from_arrays(arrays, meta, prefix)
    assert back.codes.tobytes() == qt.codes.tobytes()
    np.testing.assert_array_equal(back.scale.view(np.uint32), qt.scale.view(np.uint32))
    if qt.zero_point is None:
        assert back.zero_point is None
    else:
        np.testing.assert_array_equal(back.zero_point, qt.zero_point)
    np.testing.assert_array_equal(
        back.dequantize().view(np.uint32), qt.dequantize().view(np.uint32)
    )
    assert back.scheme == qt.scheme and back.shape == qt.shape


def test_safetensors_round_trip(tmp_path, rng: np.random.Generator) -> None:
    """The arrays save to and load from a safetensors file unchanged."""
    st_np = pytest.importorskip("safetensors.numpy")
    x = rng.standard_normal((32, 128)).astype(np.float32)
    qt = quantize(x, "int4", group_size=128, scale_format="bf16", symmetric=False)
    arrays, meta = qt.to_arrays("w.")
    import json

    st_np.save_file(arrays, tmp_path / "q.safetensors", metadata={"lowbit": json.dumps(meta)})
    loaded = st_np.load_file(tmp_path / "q.safetensors")
    back = QuantizedTensor.from_arrays(loaded, meta, "w.")
    np.testing.assert_array_equal(back.dequantize(), qt.dequantize())


def test_from_arrays_rejects_mismatched_shapes(rng: np.random.Generator) -> None:
    """Codes or scales that do not fit the recorded shape are a clear error."""
    qt = quantize(rng.standard_normal((4, 64)).astype(np.float32), "int4", group_size=32)
    arrays, meta = qt.to_arrays()
    bad = dict(meta, shape=[4, 65])
    with pytest.raises(LowbitError, match="shapes do not match"):
        QuantizedTensor.from_arrays(arrays, bad)
    short = dict(arrays, scale=arrays["scale"][:, :1].copy())
    with pytest.raises(LowbitError, match="shapes do not match"):
        QuantizedTensor.from_arrays(short, meta)
    with pytest.raises(LowbitError, match="missing array"):
        QuantizedTensor.from_arrays({"codes": arrays["codes"]}, meta)
    with pytest.raises(LowbitError, match="version"):
        QuantizedTensor.from_arrays(arrays, dict(meta, version=9))


def test_nbytes_and_bits_per_value() -> None:
    """int4 g128 with fp16 scales is 4.125 bits per value, counting every stored byte."""
    qt = quantize(np.ones((64, 256), np.float32), "int4", group_size=128, scale_format="fp16")
    assert qt.nbytes == 64 * 256 // 2 + 64 * 2 * 2
    assert qt.bits_per_value == 4.125
    assert quantize(np.ones(1000, np.float32), "int8").nbytes == 1004


# ---- NaN, inf and bad input --------------------------------------------------------


def test_nan_and_inf_raise_by_default() -> None:
    """NaN/inf in the input are an error naming how many, unless nan='propagate'."""
    with pytest.raises(LowbitError, match="1 NaN and 1 infinite"):
        quantize([1.0, np.nan, np.inf], "int8")
    with pytest.raises(LowbitError, match="NaN policy"):
        quantize([1.0], "int8", nan="ignore")


def test_nan_propagate() -> None:
    """propagate: NaN/inf codes where the format has them, else a NaN group scale;
    scales come from the finite values."""
    x = np.array([1.0, np.nan, -2.0, np.inf, 0.5, -0.25, 4.0, -np.inf], np.float32)
    q8 = quantize(x, "fp8_e5m2", group_size=4, nan="propagate")
    d = q8.dequantize()
    assert np.isnan(d[1]) and d[3] == np.inf and d[7] == -np.inf
    np.testing.assert_array_equal(d[[0, 2, 4, 5, 6]], [1.0, -2.0, 0.5, -0.25, 4.0])
    qi = quantize(x, "int8", group_size=4, nan="propagate")
    assert np.isnan(qi.scale).all()
    qm = quantize(np.r_[x, np.ones(24, np.float32)].reshape(1, 32), "mxfp4", nan="propagate")
    assert qm.to_arrays()[0]["scale"][0, 0] == 0xFF  # the E8M0 NaN
    qa = quantize(
        np.array([1.0, np.nan, 3.0, 2.0] * 2, np.float32),
        "int8",
        group_size=4,
        axis=0,
        nan="propagate",
    )
    assert np.isnan(qa.scale).all()
    qb = quantize(
        np.array([[1.0, np.nan], [3.0, 2.0]], np.float32), "int8", axis=0, nan="propagate"
    )
    assert np.isnan(qb.scale[0, 0]) and qb.scale[1, 0] == np.float32(3 / 127)


@pytest.mark.parametrize(
    ("x", "kwargs", "match"),
    [
        (np.zeros((0, 4), np.float32), {"fmt": "int8"}, "empty"),
        (np.zeros((2, 4), np.float32), {"fmt": "int8", "axis": 2}, "out of range"),
        (np.zeros((2, 4), np.float32), {"fmt": "int8", "axis": -3}, "out of range"),
        (
            np.zeros(5, np.float32),
            {"fmt": "int4", "group_size": 2, "pad": False},
            "does not divide",
        ),
        (np.zeros(4, np.float32), {"fmt": "float32"}, "too wide"),
        (np.zeros(4, np.float32), {"fmt": "e8m0"}, "cannot be scaled"),
        (np.zeros(4, np.float32), {"fmt": "fp4", "symmetric": False}, "integer format"),
        (np.zeros(4, np.float32), {"fmt": "int8", "scale_method": "meanabs"}, "binary and ternary"),
        (np.array(["a"]), {"fmt": "int8"}, "numeric"),
        (np.float32(3.0), {"fmt": "int8", "axis": 0}, "0-d"),
        (np.array([1e300, 1.0]), {"fmt": "int8", "scale_format": "float32"}, "overflows"),
    ],
)
def test_bad_input_raises(x, kwargs: dict, match: str) -> None:
    """Each bad input is a LowbitError naming the problem."""
    fmt = kwargs.pop("fmt")
    with pytest.raises(LowbitError, match=match):
        quantize(x, fmt, **kwargs)


def test_scalars_lists_and_dtypes() -> None:
    """0-d, Python lists, float16/bfloat16 and integer inputs quantize like float32."""
    import ml_dtypes

    assert quantize(np.float32(2.0), "int8").shape == ()
    x = np.array([0.5, -1.0, 0.25], np.float32)
    ref = quantize(x, "int4")
    for y in (x.astype(np.float16), x.astype(ml_dtypes.bfloat16), x.tolist(), x.astype(np.float64)):
        assert quantize(y, "int4").codes.tobytes() == ref.codes.tobytes()
    assert quantize(np.array([3, -7]), "int4").unpack().tolist() == [3, -7]


# ---- torch -------------------------------------------------------------------------


@pytest.mark.torch
def test_torch_in_torch_out_same_codes(rng: np.random.Generator) -> None:
    """Torch input gives bit-identical codes and scales; dequantize returns torch."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((16, 128)).astype(np.float32)
    for fmt, kw in (
        ("int4", {"group_size": 64}),
        ("nf4", {}),
        ("mxfp4", {}),
        ("fp8_e4m3", {"axis": 0}),
    ):
        a = quantize(x, fmt, **kw)
        b = quantize(torch.from_numpy(x).requires_grad_(), fmt, **kw)
        assert b.codes.tobytes() == a.codes.tobytes()
        np.testing.assert_array_equal(b.scale, a.scale)
        d = b.dequantize()
        assert isinstance(d, torch.Tensor) and d.dtype == torch.float32
        np.testing.assert_array_equal(d.numpy(), a.dequantize())
        assert b.dequantize(torch.bfloat16).dtype == torch.bfloat16
    xb = torch.from_numpy(x).to(torch.bfloat16)
    assert (
        quantize(xb, "int8").codes.tobytes() == quantize(xb.float().numpy(), "int8").codes.tobytes()
    )


@pytest.mark.torch
def test_eager_torch_int_quantization_agrees(rng: np.random.Generator) -> None:
    """torch.round(x / s).clamp() in float32 gives the same int8/int4 codes on random data
    (no float32 false ties occur in it), so the two paths compute one definition."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((64, 256)).astype(np.float32)
    qt = quantize(x, "int8", axis=0)
    t = torch.from_numpy(x)
    s = t.abs().amax(dim=1, keepdim=True) / 127
    np.testing.assert_array_equal(qt.scale, s.numpy())
    want = torch.round(t / s).clamp(-128, 127).to(torch.int8).numpy()
    np.testing.assert_array_equal(qt.unpack(), want)


# ---- the float32 fast paths equal the exact codec -----------------------------------

_SMALL = sorted(
    n for n, f in lowbit.FORMATS.items() if f.kind in ("float", "valueset") and f.bits <= 8
    and (f.kind != "float" or f.signed)
)  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(_SMALL),
    seed=st.integers(0, 2**32 - 1),
    mode=st.sampled_from(["nearest_even", "nearest_away"]),
)
def test_fast_paths_equal_the_codec_at_midpoints(name: str, seed: int, mode: str) -> None:
    """Codes equal fmt.encode(x / s) (float64 quotient) for values on, next to and
    between the format's midpoints and values, times a random float32 scale."""
    fmt = lowbit.format(name)
    rng = np.random.default_rng(seed)
    vals = fmt.values()
    vals = vals[np.isfinite(vals)]
    mids = (vals[:-1] + vals[1:]) / 2
    s = np.float32(rng.uniform(0.5, 1) * 2.0 ** rng.integers(-20, 20))
    pts = np.concatenate([vals, mids, rng.uniform(vals[0], vals[-1], 200)]) * np.float64(s)
    x = pts.astype(np.float32)
    x = np.concatenate(
        [x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))]
    )
    amax = np.float32(np.max(np.abs(vals)) * np.float64(s))  # pins the scale to s (or near)
    x = np.concatenate([[amax], x, [-amax]]).astype(np.float32)
    qt = quantize(x, name, scale_method="absmax", rounding=mode, granularity="tensor")
    sc = np.float64(qt.scale.reshape(-1)[0])
    want = fmt.encode(x.astype(np.float64) / sc, saturate=True, rounding=mode)
    np.testing.assert_array_equal(qt.unpack(), want)
