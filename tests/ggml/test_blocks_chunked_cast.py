"""The block quantizer casts and checks its input chunk by chunk (issue 39: a bfloat16 8B
embedding must not become a whole float32 copy), with the bytes of a whole-tensor cast."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from lowbit._arrays import bfloat16
from lowbit.checkpoints.gguf import writer
from lowbit.errors import LowbitError
from lowbit.ggml import blocks


def _bf16(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_t(5, size=shape) * 0.02).astype(np.float32).astype(bfloat16())


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "IQ4_XS", "Q8_0"])
def test_bf16_rows_give_the_float32_bytes(monkeypatch: pytest.MonkeyPatch, qtype: str) -> None:
    monkeypatch.setattr(blocks, "_CHUNK", 3 * 256)  # many chunks, one a partial one
    x = _bf16((37, 512))
    im = np.random.default_rng(1).gamma(2.0, 1.0, 512).astype(np.float32)
    want = blocks.quantize(x.astype(np.float32), qtype, imatrix=im)
    assert np.array_equal(blocks.quantize(x, qtype, imatrix=im), want)
    assert np.array_equal(
        blocks.quantize(x[:, ::1], qtype), blocks.quantize(x.astype(np.float32), qtype)
    )


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_bad_value_in_the_last_chunk_is_refused(
    monkeypatch: pytest.MonkeyPatch, bad: float
) -> None:
    monkeypatch.setattr(blocks, "_CHUNK", 256)
    x = _bf16((16, 256))
    x[-1, -1] = bad
    with pytest.raises(LowbitError, match="NaN or infinity"):
        blocks.quantize(x, "Q4_K")


def _peak(x: np.ndarray) -> int:
    tracemalloc.start()
    try:
        blocks.quantize(x, "Q4_K")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_no_float32_copy_of_the_whole_input() -> None:
    x = _bf16((16384, 1024))  # 16 M values: 32 MB in bfloat16, 64 MB as float32
    f32 = x.astype(np.float32)
    _peak(f32)  # one-time tables, kernels and thread buffers, outside the measure
    extra = _peak(x) - _peak(f32)  # what the bfloat16 input costs beyond float32's
    assert extra < 32e6, extra  # a chunk's cast per thread (4 MB each); a whole cast is 64 MB


def test_bf16_stored_as_is() -> None:
    x = _bf16((8, 64))
    x[0, :4] = np.array([np.inf, -np.inf, -0.0, 3.0e38], np.float32).astype(bfloat16())
    planned = writer._plan("t", writer.GGUFTensor(x, "BF16"))
    got = np.asarray(planned.produce())
    assert got.dtype == np.uint16
    assert np.array_equal(got, x.astype(np.float32).astype(bfloat16()).view(np.uint16))


@pytest.mark.parametrize("qtype", ["Q6_K", "Q3_K", "Q4_0", "Q5_1", "IQ4_XS", "TQ2_0"])
def test_dequantize_in_chunks_is_one_pass(monkeypatch: pytest.MonkeyPatch, qtype: str) -> None:
    """Decoding in chunks on the chunk threads (issue 39: an 8B head's decoders held several
    times its 2.1 GB in temporaries) gives the values of one decoder call over every block."""
    x = _bf16((37, 512)).astype(np.float32)
    q = blocks.quantize(x, qtype)
    t = blocks.ggml_type(qtype)
    flat = q.reshape(-1, t.size)
    if qtype in blocks.legacy_blocks.BLOCK_BYTES:
        whole = blocks.legacy_blocks.dequantize_legacy(flat, qtype)
    else:
        whole = blocks._DECODERS[qtype](flat)
    want = np.asarray(whole, dtype=np.float32).reshape(x.shape)
    monkeypatch.setattr(blocks, "_CHUNK", 3 * t.block)  # many chunks, the last a partial one
    got = blocks.dequantize(q, qtype)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert got.tobytes() == want.tobytes()
    from lowbit import _parallel

    with _parallel.serial():
        assert blocks.dequantize(q, qtype).tobytes() == want.tobytes()
    assert blocks.dequantize(q[:0], qtype).shape == (0, 512)
