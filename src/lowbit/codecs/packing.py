"""Bit-packing of codes narrower than a byte: one documented bit order, little-endian.

The packed form is a little-endian bit stream: bit ``j`` of the stream is bit ``j % 8``
(counting from the least significant bit) of byte ``j // 8``, and element ``i`` of a
``b``-bit code array occupies stream bits ``[i*b, (i+1)*b)``, its least significant bit
first. Consequences, pinned by golden-bytes tests:

* 4-bit: element 0 sits in the **low** nibble of byte 0, element 1 in the high nibble
  (the order of ONNX INT4/UINT4 and torch ``float4_e2m1fn_x2``; bitsandbytes uses the
  opposite nibble order, llama.cpp's Q4_0 pairs element j with j+16). Codes
  ``[0x1, 0x2, 0x3]`` pack to ``bytes([0x21, 0x03])``.
* 6-bit (FP6): four values fill three bytes. Codes ``[a, b, c, d]`` give
  ``byte0 = a | (b & 0x3) << 6``, ``byte1 = b >> 2 | (c & 0xF) << 4``,
  ``byte2 = c >> 4 | d << 2``.
* 2-bit: element 0 in bits 0-1, element 3 in bits 6-7 of byte 0.
* 8-bit: the bytes themselves; 16- and 32-bit codes are stored little-endian.

The last byte is padded with zero bits. ``unpack`` needs the element count, since
padding bits are indistinguishable from codes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit._arrays import code_dtype
from lowbit._parallel import map_chunks
from lowbit.codecs import _numba as _fast
from lowbit.errors import CodeRangeError, LowbitError

_SUPPORTED = (*range(1, 9), 16, 32)


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes that ``count`` codes of ``bits`` bits occupy when packed."""
    return (count * bits + 7) // 8


def _check_bits(bits: Any) -> int:
    if not isinstance(bits, (int, np.integer)) or int(bits) not in _SUPPORTED:
        raise LowbitError(f"cannot pack {bits!r}-bit codes; allowed widths: 1..8, 16, 32")
    return int(bits)


def pack(codes: Any, bits: int) -> np.ndarray:
    """Bit-pack unsigned codes (any shape, flattened in C order) into a uint8 array.

    Args:
        codes: non-negative integers below ``2**bits`` (any integer dtype, any shape).
        bits: the code width: 1..8, 16 or 32.

    Returns:
        uint8 array of ``ceil(codes.size * bits / 8)`` bytes in the bit order of this
        module's docstring.

    Raises:
        LowbitError: unsupported width or non-integer codes.
        CodeRangeError: a code does not fit in ``bits`` bits.
    """
    bits = _check_bits(bits)
    arr = np.asarray(codes)
    if arr.dtype.kind not in "iu":
        raise LowbitError(f"codes to pack must be integers, got dtype {arr.dtype}")
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.size and arr.dtype.kind == "i" and int(flat.min()) < 0:
        raise CodeRangeError(f"negative code {int(flat.min())}: pack takes unsigned codes")
    if flat.size and int(flat.max()) >= (1 << bits) and (arr.dtype.itemsize * 8 > bits):
        raise CodeRangeError(
            f"code {int(flat.max())} does not fit in {bits} bits (max {(1 << bits) - 1})"
        )
    return _pack_unchecked(flat, bits)


def _pack_unchecked(flat: np.ndarray, bits: int) -> np.ndarray:
    """``pack`` for a flat array of codes already known to fit."""
    n = flat.size
    if bits == 8:
        return flat.astype(np.uint8)
    if bits in (16, 32):
        return flat.astype(f"<u{bits // 8}").view(np.uint8).copy()
    if bits == 4:
        c = flat.astype(np.uint8, copy=False)
        fast = _fast.pack4(c)
        if fast is not None:
            return fast
        out = np.empty((n + 1) // 2, dtype=np.uint8)
        half = n // 2
        lo = c[0 : 2 * half : 2]
        hi = c[1 : 2 * half : 2]
        np.left_shift(hi, 4, out=out[:half])
        np.bitwise_or(out[:half], lo, out=out[:half])
        if n % 2:
            out[-1] = c[-1]
        return out
    # general width: 8 codes make exactly ``bits`` bytes; build them in a uint64
    groups = (n + 7) // 8
    padded = np.zeros(groups * 8, dtype=np.uint64)
    padded[:n] = flat
    g = padded.reshape(groups, 8)
    word = g[:, 0].copy()
    for k in range(1, 8):
        word |= g[:, k] << np.uint64(k * bits)
    out = word.astype("<u8").view(np.uint8).reshape(groups, 8)[:, :bits]
    return np.ascontiguousarray(out).reshape(-1)[: packed_nbytes(n, bits)]


_SPLIT = 1 << 22  # packed bytes per chunk of the 4-bit unpack


def unpack(packed: Any, bits: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack`: ``count`` codes of ``bits`` bits from packed bytes.

    Args:
        packed: uint8 array (any shape, read flat) as written by ``pack``.
        bits: the code width: 1..8, 16 or 32.
        count: how many codes to read.

    Returns:
        A flat array of ``count`` codes in the smallest unsigned dtype that holds them.

    Raises:
        LowbitError: unsupported width, non-uint8 input, or too few bytes for ``count``.
    """
    bits = _check_bits(bits)
    buf = np.asarray(packed)
    if buf.dtype != np.uint8:
        raise LowbitError(f"packed codes must be uint8, got {buf.dtype}")
    count = int(count)
    if count < 0:
        raise LowbitError(f"count must be >= 0, got {count}")
    need = packed_nbytes(count, bits)
    flat = np.ascontiguousarray(buf).reshape(-1)
    if flat.size < need:
        raise LowbitError(f"{count} codes of {bits} bits need {need} bytes, got {flat.size}")
    flat = flat[:need]
    dt = code_dtype(bits)
    if bits == 8:
        return flat.copy()
    if bits in (16, 32):
        return flat.view(f"<u{bits // 8}").astype(dt)
    if bits == 4:
        out = np.empty(2 * need, dtype=np.uint8)

        def nibbles(i: int) -> None:  # bytes [i, i + _SPLIT): a few MB, on the chunk threads
            part = flat[i : i + _SPLIT]
            o = out[2 * i : 2 * (i + part.size)]
            np.bitwise_and(part, 0x0F, out=o[0::2])
            np.right_shift(part, 4, out=o[1::2])

        map_chunks(nibbles, range(0, need, _SPLIT))
        return out[:count]
    groups = (count + 7) // 8
    raw = np.zeros((groups, 8), dtype=np.uint8)
    raw8 = np.zeros(groups * bits, dtype=np.uint8)
    raw8[:need] = flat
    raw[:, :bits] = raw8.reshape(groups, bits)
    word = raw.view("<u8").reshape(groups)
    mask = np.uint64((1 << bits) - 1)
    out = np.empty((groups, 8), dtype=dt)
    for k in range(8):
        out[:, k] = (word >> np.uint64(k * bits)) & mask
    return out.reshape(-1)[:count]
