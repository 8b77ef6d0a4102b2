"""``finite_amax`` reads the largest finite magnitude from the stored words: the same float32
as ``max(abs(x[isfinite(x)]))`` for every bfloat16 and float16 bit pattern, and for float32
and float64 arrays with NaN, infinities, signed zeros, subnormals, strides and byte orders."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lowbit.quant._choose import finite_amax, own_tensor_scale
from lowbit.quant.scheme_text import parse_scheme
from lowbit.quant.shared_scale import tensor_scale_of


def _oracle(x: np.ndarray) -> np.float32:
    with np.errstate(invalid="ignore"):  # NaN casts
        a = np.asarray(x).astype(np.float64)
    finite = a[np.isfinite(a)]
    return np.float32(np.max(np.abs(finite))) if finite.size else np.float32(0)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_every_16_bit_pattern(dtype: type) -> None:
    words = np.arange(1 << 16, dtype=np.uint16)
    x = words.view(dtype)
    assert finite_amax(x) == _oracle(x)
    # each pattern alone (its own maximum), 0 for NaN and infinities
    one = np.empty(1, dtype=np.uint16)
    for w in words:
        one[0] = w
        got, want = finite_amax(one.view(dtype)), _oracle(one.view(dtype))
        assert got.tobytes() == want.tobytes(), hex(int(w))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", range(20))
def test_wide_floats_with_specials(dtype: type, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 40)).astype(dtype)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    specials = np.concatenate([specials, np.array([tiny, -tiny * 3], dtype=dtype)])
    where = rng.integers(0, n, size=int(rng.integers(0, 8)))
    x[where] = rng.choice(specials, size=where.size)
    assert finite_amax(x).tobytes() == _oracle(x).tobytes()
    assert finite_amax(x[::3]).tobytes() == _oracle(x[::3]).tobytes()  # strided: a copy
    swapped = x.astype(x.dtype.newbyteorder())  # big-endian words: not read in place
    assert finite_amax(swapped).tobytes() == _oracle(x).tobytes()


def test_chunks_and_shapes() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 1 << 21)).astype(np.float32)  # more than one chunk
    x[2, -1] = -1e30  # the largest in the last chunk
    x[0, 5] = np.inf
    assert finite_amax(x) == np.float32(1e30)
    assert finite_amax(np.full((4, 4), np.nan, np.float32)) == 0
    assert finite_amax(np.zeros((0, 8), np.float32)) == 0
    assert finite_amax(np.float32(-2.5).reshape(())) == np.float32(2.5)
    assert finite_amax(np.array([1, -7, 3], dtype=np.int8)) == np.float32(7)  # other dtypes


def test_tensor_scale_of_stored_bf16_is_the_float32_ones() -> None:
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 256)) * rng.lognormal(size=(64, 1))).astype(ml_dtypes.bfloat16)
    w[3, 7] = np.inf
    scheme = parse_scheme("nvfp4")
    want = own_tensor_scale(w.astype(np.float32), scheme)
    assert tensor_scale_of(w, scheme).tobytes() == want.tobytes()
    assert tensor_scale_of(w.astype(np.float32), scheme).tobytes() == want.tobytes()


def test_all_e4m3_is_the_float8_round_trip() -> None:
    """Every float8_e4m3fn value and its float32 neighbours, and random float32 words: the
    bit test says what the round trip through ml_dtypes' float8 says."""
    from lowbit.checkpoints.compressed_tensors.fp4 import all_e4m3

    fp8 = ml_dtypes.float8_e4m3fn
    every = np.arange(256, dtype=np.uint8).view(fp8).astype(np.float32)
    every = every[np.isfinite(every)]
    up = np.nextafter(every, np.float32(np.inf))
    down = np.nextafter(every, np.float32(-np.inf))
    rng = np.random.default_rng(11)
    words = rng.integers(0, 1 << 32, size=40_000, dtype=np.uint64).astype(np.uint32)
    near = (rng.integers(0, 1 << 9, size=10_000) << 20).astype(np.uint32) | np.uint32(0x3C000000)
    cases = np.concatenate([every, up, down, words.view(np.float32), near.view(np.float32)])
    cases = np.concatenate([cases, np.float32([np.nan, np.inf, -np.inf, 480.0, 464.0, 2.0**-10])])
    with np.errstate(invalid="ignore", over="ignore"):
        want = cases.astype(fp8).astype(np.float32) == cases
    got = np.array([all_e4m3(c.reshape(1)) for c in cases])
    assert np.array_equal(got, want)
    assert want.sum() > 1000 and (~want).sum() > 1000  # both kinds are exercised
    assert all_e4m3(every) and not all_e4m3(np.append(every, np.float32(0.3)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"])
def test_narrow_floats_widen_to_their_float32_bits(
    monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    """quantize's input widening (in chunks on the chunk threads; bfloat16 by its bits) gives
    ml_dtypes' float32 of every bit pattern, NaNs' bits included, in any chunking."""
    import ml_dtypes

    from lowbit.quant import tensor

    dt = np.dtype(getattr(ml_dtypes, dtype)) if dtype != "float16" else np.dtype(np.float16)
    words = np.arange(1 << (8 * dt.itemsize), dtype=f"u{dt.itemsize}")
    x = words.view(dt).reshape(-1, 16)
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float32)
    monkeypatch.setattr(tensor, "_WIDEN_CHUNK", 100)  # many chunks, the last a partial one
    got, _ = tensor._as_input(x)
    assert got.dtype == np.float32 and got.shape == x.shape and got.flags.c_contiguous
    assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    got, _ = tensor._as_input(x[:, ::2])  # not contiguous
    assert (
        got.view(np.uint32).tobytes()
        == np.ascontiguousarray(want[:, ::2]).view(np.uint32).tobytes()
    )
    scalar, _ = tensor._as_input(x[3, 5:6].reshape(()))  # a 0-d array stays 0-d
    assert scalar.shape == () and scalar.view(np.uint32) == want[3, 5].view(np.uint32)
