"""lowbit.codecs.packing: one little-endian bit order, pinned by golden bytes; pack/unpack identity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lowbit import LowbitError
from lowbit.codecs.packing import pack, packed_nbytes, unpack
from lowbit.errors import CodeRangeError

WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)

# ---- golden bytes -----------------------------------------------------------------


def test_pack_4bit_low_nibble_first() -> None:
    """4-bit: element 0 in the low nibble (ONNX INT4 / torch float4_e2m1fn_x2 order)."""
    assert pack([0x1, 0x2, 0x3], 4).tobytes() == bytes([0x21, 0x03])
    assert pack([0xF, 0x0], 4).tobytes() == bytes([0x0F])


def test_pack_6bit_four_values_in_three_bytes() -> None:
    """6-bit (FP6): four codes fill exactly three bytes, least significant bits first."""
    a, b, c, d = 0b000001, 0b000010, 0b000011, 0b000100
    out = pack([a, b, c, d], 6).tobytes()
    assert out == bytes([a | (b & 3) << 6, b >> 2 | (c & 0xF) << 4, c >> 4 | d << 2])
    assert out == bytes([0x81, 0x30, 0x10])
    assert pack([0x3F] * 4, 6).tobytes() == b"\xff\xff\xff"


def test_pack_2bit_and_3bit_and_1bit_golden() -> None:
    """2-bit: element 0 in bits 0-1; 3-bit codes straddle bytes; 1-bit is LSB first."""
    assert pack([1, 2, 3, 0], 2).tobytes() == bytes([0b00111001])
    assert pack([0b101, 0b011, 0b110], 3).tobytes() == bytes([0b10_011_101, 0b00000001])
    assert pack([1, 0, 0, 0, 0, 0, 0, 1, 1], 1).tobytes() == bytes([0x81, 0x01])


def test_pack_wide_codes_little_endian() -> None:
    """8-bit codes are the bytes; 16- and 32-bit codes are stored little-endian."""
    assert pack([7, 255], 8).tobytes() == bytes([7, 255])
    assert pack([0x1234], 16).tobytes() == bytes([0x34, 0x12])
    assert pack([0x01020304], 32).tobytes() == bytes([4, 3, 2, 1])


# ---- identity ---------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    bits=st.sampled_from(WIDTHS),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=13),
    data=st.data(),
)
def test_pack_unpack_identity(bits: int, shape: tuple[int, ...], data: st.DataObject) -> None:
    """unpack(pack(c)) == c for any shape, odd lengths included, in ceil(n*b/8) bytes."""
    hi = (1 << bits) - 1
    codes = data.draw(hnp.arrays(np.uint64, shape, elements=st.integers(0, hi)))
    packed = pack(codes, bits)
    assert packed.dtype == np.uint8
    assert packed.size == packed_nbytes(codes.size, bits)
    back = unpack(packed, bits, codes.size)
    np.testing.assert_array_equal(back, codes.reshape(-1))
    assert back.dtype.itemsize * 8 >= bits


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from(WIDTHS[:8]), n=st.integers(0, 40), data=st.data())
def test_padding_bits_are_zero(bits: int, n: int, data: st.DataObject) -> None:
    """The unused bits of the last byte are zero (so equal codes give equal bytes)."""
    codes = np.array(data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=n, max_size=n)))
    packed = pack(codes.astype(np.uint8), bits)
    used = n * bits
    if used % 8:
        assert int(packed[-1]) >> (used % 8) == 0


def test_unpack_reads_exactly_count_codes() -> None:
    """unpack ignores trailing bytes beyond count and keeps the element order."""
    p = pack(np.arange(10) % 8, 3)
    np.testing.assert_array_equal(
        unpack(np.concatenate([p, [255]]).astype(np.uint8), 3, 10), np.arange(10) % 8
    )


# ---- bad input --------------------------------------------------------------------


def test_pack_rejects_codes_that_do_not_fit() -> None:
    """A code >= 2**bits or negative is a CodeRangeError naming it."""
    with pytest.raises(CodeRangeError, match="16"):
        pack([16], 4)
    with pytest.raises(CodeRangeError, match="negative"):
        pack(np.array([-1], dtype=np.int8), 4)


def test_pack_rejects_bad_widths_and_dtypes() -> None:
    """Unsupported widths, float codes, short buffers and non-uint8 input are LowbitErrors."""
    with pytest.raises(LowbitError, match="allowed widths"):
        pack([1], 9)
    with pytest.raises(LowbitError, match="integers"):
        pack(np.array([1.0]), 4)
    with pytest.raises(LowbitError, match="need 2 bytes"):
        unpack(np.zeros(1, np.uint8), 4, 3)
    with pytest.raises(LowbitError, match="uint8"):
        unpack(np.zeros(2, np.int16), 4, 3)


@pytest.mark.parametrize("count", [0, 1, 9, 64, 65])
def test_four_bit_unpack_in_chunks_is_one_pass(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """The 4-bit unpack splits the bytes into chunks on the chunk threads (an 8B layer's codes
    are tens of MB); every split, the last a partial one, gives the codes back."""
    from lowbit import _parallel
    from lowbit.codecs import packing

    monkeypatch.setattr(packing, "_SPLIT", 3)  # 3 bytes a chunk
    codes = np.random.default_rng(count).integers(0, 16, size=count).astype(np.uint8)
    packed = pack(codes, 4)
    assert np.array_equal(unpack(packed, 4, count), codes)
    with _parallel.serial():
        assert np.array_equal(unpack(packed, 4, count), codes)


def test_fp4_nibbles_pack_in_chunks_of_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """compressed-tensors' FP4 packing (even column in the low nibble) over chunks of rows."""
    from lowbit.checkpoints.compressed_tensors import fp4

    monkeypatch.setattr(fp4, "_PACK_BYTES", 40)  # two rows of 16 a chunk
    codes = np.random.default_rng(5).integers(0, 16, size=(7, 16)).astype(np.uint8)
    got = fp4.pack_fp4(codes)
    want = np.array([[int(r[i]) | int(r[i + 1]) << 4 for i in range(0, 16, 2)] for r in codes])
    assert got.dtype == np.uint8 and np.array_equal(got, want)
    assert np.array_equal(fp4.unpack_fp4(got), codes)
