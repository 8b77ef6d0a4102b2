"""The compiled kernels of llama.cpp's Q4_0/Q4_1/Q8_0 blocks (``lowbit.ggml._numba``): bit for
bit the numpy path and gguf's reference."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from lowbit import LowbitError, _parallel
from lowbit.codecs import _numba as _fast
from lowbit.ggml import _numba as _ggmlfast

pytestmark = pytest.mark.skipif(not _fast.HAVE_NUMBA, reason="numba is not installed")


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Three threads (one under ``serial()``); kernels at any size."""
    real = _parallel.threads
    monkeypatch.setattr(_parallel, "threads", lambda: 1 if real() == 1 else 3)
    with _fast.kernels_always():  # the default leaves small tensors to numpy
        yield


def _run(fn: Any) -> Any:
    try:
        return fn()
    except LowbitError as exc:
        return exc


def _ggml_blocks(rng: np.random.Generator) -> np.ndarray:
    """Blocks of 32 values (rows of 128) on the edges of llama.cpp's Q4_0/Q8_0 rounding:
    zero and negative-zero blocks, ties of magnitude (the first wins), quotients on .5,
    float16-subnormal and overflowing-inverse scales, huge values, random rows."""
    x = (rng.standard_normal((64, 128)) * rng.uniform(0.01, 100, (64, 1))).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = -0.0
    x[1, 32:64] = 0.0
    x[1, 40] = -0.0
    x[2, :32] = np.float32(-1.0)
    x[3, :32] = np.arange(32) - 15.5
    x[4, 32:64] = (np.arange(32) - 16) * np.float32(127 / 16)
    x[5] *= np.float32(1e-30)
    x[6] *= np.float32(1e-38)  # 1/d overflows: code 0 (or 8), as the numpy path
    x[7] = np.float32(2.0) ** -np.arange(128)
    x[8, 5], x[8, 9] = 7.0, -7.0
    x[9, 5], x[9, 9] = -7.0, 7.0
    x[10, :32] = rng.integers(-8, 8, 32) * np.float32(0.375)  # on the Q4_0 grid
    x[11, :32] = rng.integers(-127, 128, 32) * np.float32(0.5) + np.float32(0.25)
    x[12] *= np.float32(300)
    return x


def test_ggml_encode_kernel_matches_numpy() -> None:
    """legacy.quantize (Q4_0, Q8_0): the compiled kernel gives the numpy path's bytes and
    gguf's reference bytes, on edge blocks and on random blocks in many bands."""
    import gguf

    from lowbit.ggml import legacy

    rng = np.random.default_rng(13)
    big = rng.standard_normal((3 * _ggmlfast._ENCODE_BAND // 4 + 5, 128)).astype(np.float32)
    for x in (_ggml_blocks(rng), big):
        for qtype in ("Q4_0", "Q8_0"):
            assert _ggmlfast.ggml_encode(x.reshape(-1, 32), 4) is not None  # the kernel runs
            fast = legacy.quantize(x, qtype)
            with _fast.numpy_only():
                slow = legacy.quantize(x, qtype)
            assert fast.shape == slow.shape and np.array_equal(fast, slow), qtype
            ref = gguf.quants.quantize(x, getattr(gguf.GGMLQuantizationType, qtype))
            assert np.array_equal(fast, ref), qtype


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_ggml_encode_kernel_errors_as_numpy(qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN, an infinity or a block scale beyond float16 gives the numpy path's error: the
    one its chunk loop meets first (an overflow in an earlier chunk than the NaN, else the
    NaN); the float64 and strided inputs the kernel does not take go to numpy."""
    from lowbit.ggml import legacy

    monkeypatch.setattr(legacy, "_CHUNK", 3)
    big = np.float32(1e8)
    cases = []
    for nan_block, big_block in ((7, 2), (7, 6), (7, 7), (7, 8), (4, None), (None, 9)):
        x = np.ones((12, 32), dtype=np.float32)
        if nan_block is not None:
            x[nan_block, 3] = np.nan if nan_block % 2 else -np.inf
        if big_block is not None:
            x[big_block, 30] = big
        cases.append(x)
    for x in cases:
        got = _run(lambda x=x: legacy.quantize(x, qtype))
        with _fast.numpy_only():
            want = _run(lambda x=x: legacy.quantize(x, qtype))
        assert isinstance(want, LowbitError) and type(got) is type(want)
        assert str(got) == str(want)
    x = np.random.default_rng(2).standard_normal((4, 64))
    assert _ggmlfast.ggml_encode(x.reshape(-1, 32), 8) is None  # float64: numpy
    assert _ggmlfast.ggml_encode(x.astype(np.float32)[:, ::2], 8) is None  # strided: numpy
    assert np.array_equal(legacy.quantize(x, qtype), legacy.quantize(x.astype(np.float32), qtype))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_ggml_decode_kernel_matches_numpy(qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """GGUF Q4_0/Q4_1/Q8_0 tensors decode to gguf's bits with the kernel, on random bytes
    with every finite float16 scale and minimum; bands holding a NaN or an infinite scale or
    minimum (numpy's path, which keeps gguf's NaN bits) decode to gguf's bits too."""
    import gguf

    from lowbit.checkpoints.io import gguf_file as _gguf

    kind = getattr(gguf.quants, qtype)
    rng = np.random.default_rng(zlib.crc32(qtype.encode()))
    raw = rng.integers(0, 256, (4096, kind.type_size), dtype=np.uint8)
    finite = np.arange(1 << 16, dtype=np.uint16)
    finite = finite[np.isfinite(finite.view(np.float16))]
    scales = rng.permutation(np.resize(finite, 2 * raw.shape[0])).reshape(-1, 2)
    raw[:, 0:2] = scales[:, :1].view(np.uint8)
    if qtype == "Q4_1":
        raw[:, 2:4] = scales[:, 1:].view(np.uint8)
    values = np.empty((raw.shape[0], 32), dtype=np.float32)
    assert _ggmlfast.ggml_decode(raw, values, qtype, values.size)  # every block: the kernel
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, qtype))
    assert np.array_equal(values.view(np.uint32), want.reshape(values.shape).view(np.uint32))
    raw[100, 0:2] = (0x01, 0x7E)  # a NaN with a payload: that band goes to numpy
    raw[3000, 1] = 0xFC  # -inf
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, qtype))
        for per_band in (1 << 18, 64 * 32):
            monkeypatch.setattr(_gguf, "_DEQUANT_VALUES", per_band)
            got = _gguf._dequantize_rows(kind, raw.reshape(64, -1), want.size)
            assert np.array_equal(got.view(np.uint32), want.reshape(-1).view(np.uint32))
            with _fast.numpy_only():
                slow = _gguf._dequantize_rows(kind, raw.reshape(64, -1), want.size)
            assert np.array_equal(slow.view(np.uint32), want.reshape(-1).view(np.uint32))
    assert not _ggmlfast.ggml_decode(raw, values, qtype, values.size)  # NaN: numpy's


def test_ggml_kernels_wait_for_a_large_tensor_or_a_loaded_numba(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GGML tensors below GGML_ALONE values take the kernels only once numba is loaded
    (its start costs more than they save); larger ones, or kernels_always(), take them."""
    import sys

    monkeypatch.setattr(_fast._kernels_always, "on", False)
    small, large = _ggmlfast.GGML_ALONE - 32, _ggmlfast.GGML_ALONE
    assert _ggmlfast._ggml_kernels(small) and _ggmlfast._ggml_kernels(large)
    monkeypatch.delitem(sys.modules, "numba")
    assert not _ggmlfast._ggml_kernels(small) and _ggmlfast._ggml_kernels(large)
    assert _ggmlfast.ggml_encode(np.zeros((small // 32, 32), np.float32), 4) is None
    with _fast.kernels_always():
        assert _ggmlfast._ggml_kernels(small)
    with _fast.numpy_only():
        assert not _ggmlfast._ggml_kernels(large)


KQUANTS = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
_HEAD = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _kquant_bytes(qtype: str, rng: np.random.Generator, n: int = 96) -> np.ndarray:
    """Random super-blocks of ``qtype`` (every code, scale and high bit drawn), their float16
    scale and minimum drawn from every finite pattern (subnormals, zeros of both signs, the
    largest); a few real blocks of llama.cpp's rounding too."""
    from lowbit.ggml import blocks

    raw = rng.integers(0, 256, size=(n, KQUANTS[qtype]), dtype=np.uint8)
    for off in _HEAD[qtype]:
        h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
        h[(h & 0x7C00) == 0x7C00] &= 0xBBFF  # no inf/NaN: clear one exponent bit
        h[:4] = [0x0000, 0x8000, 0x0001, 0x7BFF]
        raw[:, off : off + 2] = h.view(np.uint8).reshape(n, 2)
    x = (rng.standard_t(4, size=(8, 256)) * 0.03).astype(np.float32)
    return np.concatenate([raw, blocks.quantize(x, qtype).reshape(8, -1)])


@pytest.mark.parametrize("qtype", sorted(KQUANTS))
def test_kquant_decode_kernel_is_the_numpy_decoders_bits(qtype: str) -> None:
    """Q2_K..Q6_K decoded by the compiled kernel: the bits of ``lowbit.ggml.kquants``' numpy
    decoders over random super-blocks; a block with a non-finite scale is left to numpy
    (False), and ``blocks.dequantize`` gives the same values either way."""
    from lowbit.ggml import blocks, kquants

    rng = np.random.default_rng(zlib.crc32(qtype.encode()))
    raw = _kquant_bytes(qtype, rng)
    want = getattr(kquants, f"dequantize_{qtype.lower()}")(raw).astype(np.float32)
    out = np.empty((raw.shape[0], 256), dtype=np.float32)
    assert _ggmlfast.kquant_decode(raw, out, qtype, raw.shape[0] * 256)
    assert out.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    assert blocks.dequantize(raw, qtype).tobytes() == want.tobytes()
    bad = raw.copy()
    bad[5, _HEAD[qtype][-1] : _HEAD[qtype][-1] + 2] = [0x00, 0x7C]  # +inf
    assert not _ggmlfast.kquant_decode(bad, out, qtype, raw.shape[0] * 256)
    with np.errstate(all="ignore"):
        ref = getattr(kquants, f"dequantize_{qtype.lower()}")(bad).astype(np.float32)
    assert blocks.dequantize(bad, qtype).view(np.uint32).tobytes() == ref.view(np.uint32).tobytes()
    with _fast.numpy_only():
        assert blocks.dequantize(raw, qtype).tobytes() == want.tobytes()


@pytest.mark.parametrize("qtype", sorted(KQUANTS))
def test_gguf_reader_decodes_kquants_as_gguf_does(
    qtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF file's Q2_K..Q6_K tensors decode through the compiled kernel to gguf's own
    ``dequantize_rows`` bits (every band, and with a non-finite scale, which goes to gguf's)."""
    import gguf

    from lowbit.checkpoints.io import gguf_file as _gguf

    kind = getattr(gguf.quants, qtype)
    kind.init_grid()
    rng = np.random.default_rng(zlib.crc32(qtype.encode()) + 1)
    raw = _kquant_bytes(qtype, rng, n=120)[:128]
    with np.errstate(all="ignore"):
        want = kind.dequantize_rows(raw).reshape(-1).astype(np.float32)
    out = np.empty((raw.shape[0], 256), dtype=np.float32)
    assert _ggmlfast.kquant_decode(raw, out, qtype, out.size)  # every block: the kernel
    assert out.reshape(-1).view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    calls: list[int] = []
    real = kind.dequantize_rows
    monkeypatch.setattr(kind, "dequantize_rows", lambda b: calls.append(1) or real(b))
    got = _gguf._dequantize_rows(kind, raw.reshape(32, -1), want.size)
    assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes() and not calls
    raw[7, _HEAD[qtype][0] : _HEAD[qtype][0] + 2] = [0x01, 0x7E]  # a NaN scale
    with np.errstate(all="ignore"):
        want = kind.dequantize_rows(raw).reshape(-1).astype(np.float32)
    for per_band in (1 << 18, 4 * 256):
        monkeypatch.setattr(_gguf, "_DEQUANT_VALUES", per_band)
        got = _gguf._dequantize_rows(kind, raw.reshape(32, -1), want.size)
        assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    assert calls  # the band with the NaN scale went to gguf's decoder
