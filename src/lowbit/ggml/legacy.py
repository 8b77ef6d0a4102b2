"""llama.cpp's Q8_0 and Q4_0 block formats: quantize, dequantize, and build blocks from codes.

Both formats cut each row (the last axis) into blocks of 32 values that share one float16 scale
``d``. Definitions, from ggml's reference quantizers (``quantize_row_q8_0_ref`` and
``quantize_row_q4_0_ref`` in ggml-quants.c; block layouts in ggml-common.h), all arithmetic in
float32:

``Q8_0`` (34 bytes a block: float16 ``d``, then 32 int8 ``q``)
    ``d = max|x| / 127``; ``q = round_half_away(x * (1/d))`` (0 when ``d == 0``); value ``d*q``.
``Q4_0`` (18 bytes a block: float16 ``d``, then 16 bytes of nibbles)
    ``m`` = the block's value of largest magnitude, sign kept (the first one on ties);
    ``d = m / -8``; ``q = min(15, trunc(x * (1/d) + 8.5))`` in 0..15; value ``d*(q - 8)``.
    Byte ``j`` of the nibbles holds element ``j`` in its low nibble and element ``j + 16`` in
    its high nibble (not adjacent elements): elements 0 and 16 of codes 1 and 15 make ``0xF1``.

Both store ``d`` rounded to float16 (round to nearest even) but quantize with the unrounded
float32 ``d``, so the codes match llama.cpp byte for byte. The functions here give the same bytes
as the ``gguf`` package's reference ``gguf.quants.quantize`` (checked in tests) and dequantize
exactly as ``gguf.quants.dequantize`` does.

In lowbit's own terms, Q4_0 is symmetric int4 with group size 32 along the last axis and float16
scales (code ``q - 8`` in -8..7, value ``scale * code``), and Q8_0 is int8 with group size 32 and
float16 scales: :func:`q4_0_from_codes` and :func:`q8_0_from_codes` write such tensors losslessly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit._arrays import _is_ml_float
from lowbit.errors import LowbitError
from lowbit.ggml import _numba

__all__ = [
    "BLOCK",
    "QTYPES",
    "dequantize",
    "dequantize_q4_0",
    "dequantize_q8_0",
    "ggml_block_codes",
    "nbytes",
    "q4_0_from_codes",
    "q4_0_to_codes",
    "q8_0_from_codes",
    "q8_0_to_codes",
    "quantize",
    "quantize_q4_0",
    "quantize_q8_0",
]

BLOCK = 32
"""Values per block in both formats."""

# bytes per block: float16 scale + payload
_BLOCK_BYTES = {"Q8_0": 2 + BLOCK, "Q4_0": 2 + BLOCK // 2}
QTYPES = tuple(_BLOCK_BYTES)
"""The block types this module implements."""

_F16_MAX = float(np.finfo(np.float16).max)


def _qtype(qtype: str) -> str:
    name = str(getattr(qtype, "name", qtype)).upper()
    if name not in _BLOCK_BYTES:
        raise LowbitError(f"unknown GGUF block type {qtype!r}; this module writes {list(QTYPES)}")
    return name


def nbytes(shape: tuple[int, ...], qtype: str) -> int:
    """Bytes a tensor of ``shape`` takes in ``qtype`` (Q8_0: 34 per 32 values, Q4_0: 18)."""
    name = _qtype(qtype)
    numel = int(np.prod(shape, dtype=np.int64))
    return numel // BLOCK * _BLOCK_BYTES[name]


_CHUNK = 1 << 12  # blocks per step (128 Ki values): small temporaries that stay in cache


def _blockwise(x: Any, qtype: str, encode: Any) -> np.ndarray:
    """Check ``x``, then encode it ``_CHUNK`` blocks at a time into the output bytes."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" and not _is_ml_float(arr.dtype):
        raise LowbitError(f"{qtype} quantizes real numbers, got an array of dtype {arr.dtype}")
    if arr.ndim == 0 or arr.shape[-1] % BLOCK != 0:
        raise LowbitError(
            f"{qtype} needs rows (last axis) that are a multiple of {BLOCK} values, "
            f"got shape {arr.shape}"
        )
    shape = arr.shape
    flat = arr.reshape(-1, BLOCK)
    size = _BLOCK_BYTES[qtype]
    fast = _numba.ggml_encode(flat, 8 if qtype == "Q8_0" else 4)
    if fast is not None:
        out = _finish_compiled(*fast, qtype)
        return out.reshape(*shape[:-1], shape[-1] // BLOCK * size)
    out = np.empty((flat.shape[0], size), dtype=np.uint8)
    for start in range(0, flat.shape[0], _CHUNK):
        blocks = flat[start : start + _CHUNK].astype(np.float32)
        if not np.isfinite(blocks).all():
            raise LowbitError(f"{qtype} cannot hold NaN or infinity; the input has some")
        out[start : start + _CHUNK] = encode(blocks)
    return out.reshape(*shape[:-1], shape[-1] // BLOCK * size)


def _finish_compiled(out: np.ndarray, d: np.ndarray, bad: int, qtype: str) -> np.ndarray:
    """The compiled kernel's blocks with their float16 scales, or the error the chunk loop
    above raises first: a scale overflow in a chunk before the first chunk holding a NaN
    or an infinity, else that NaN."""
    _check_scales(d if bad < 0 else d[: bad // _CHUNK * _CHUNK], qtype)
    if bad >= 0:
        raise LowbitError(f"{qtype} cannot hold NaN or infinity; the input has some")
    out.view(np.uint16)[:, 0] = d.astype(np.float16).view(np.uint16)
    return out


def _inverse(d: np.ndarray) -> np.ndarray:
    """1/d in float32, and 0 where d is 0 (an all-zero block quantizes to code 0).

    Where 1/d overflows (blocks below about 1e-36, whose float16 scale is 0 anyway) llama.cpp's
    C code is undefined; we give code 0 there too.
    """
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(1) / d
    return np.where(np.isfinite(inv), inv, np.float32(0)).astype(np.float32)


def _check_scales(d: np.ndarray, qtype: str) -> None:
    if np.any(np.abs(d) > _F16_MAX):
        raise LowbitError(
            f"{qtype} block scale overflows float16 (a block's largest |value| exceeds "
            f"{_F16_MAX * (127 if qtype == 'Q8_0' else 8):.6g})"
        )


def _scale_bytes(d: np.ndarray, qtype: str) -> np.ndarray:
    _check_scales(d, qtype)
    return d.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero, exactly (``roundf`` in C)."""
    a = np.abs(v)
    whole = np.floor(a)
    a -= whole  # the fraction, exact in binary floating point
    whole += a >= np.float32(0.5)
    return np.copysign(whole, v, out=whole)


def quantize_q8_0(x: Any) -> np.ndarray:
    """Quantize ``x`` to Q8_0 blocks, byte-identical to llama.cpp's reference quantizer.

    Args:
        x: real array whose last axis is a multiple of 32 (converted to float32 first).

    Returns:
        uint8 array of shape ``(*x.shape[:-1], x.shape[-1] // 32 * 34)``: per block the
        little-endian float16 scale, then 32 int8 codes.

    Raises:
        LowbitError: a row length that is not a multiple of 32, NaN/inf input, or a block
        scale beyond float16's range.
    """
    return _blockwise(x, "Q8_0", _encode_q8_0)


def _encode_q8_0(blocks: np.ndarray) -> np.ndarray:
    d, q = _q8_0_core(blocks)
    return np.concatenate([_scale_bytes(d, "Q8_0"), q.view(np.uint8)], axis=1)


def _q8_0_core(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 32) float32 -> (float32 scale d (n, 1), unrounded; int8 codes (n, 32))."""
    d = (np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    return d, _round_half_away(blocks * _inverse(d)).astype(np.int8)


def quantize_q4_0(x: Any) -> np.ndarray:
    """Quantize ``x`` to Q4_0 blocks, byte-identical to llama.cpp's reference quantizer.

    Args:
        x: real array whose last axis is a multiple of 32 (converted to float32 first).

    Returns:
        uint8 array of shape ``(*x.shape[:-1], x.shape[-1] // 32 * 18)``: per block the
        little-endian float16 scale, then 16 bytes of nibbles (element j low, j + 16 high).

    Raises:
        LowbitError: as for :func:`quantize_q8_0`.
    """
    return _blockwise(x, "Q4_0", _encode_q4_0)


def _encode_q4_0(blocks: np.ndarray) -> np.ndarray:
    d, q = _qn_0_core(blocks, 4)
    return np.concatenate([_scale_bytes(d, "Q4_0"), _pack_nibbles(q)], axis=1)


def _qn_0_core(blocks: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 (bits 4) / Q5_0 (bits 5) rounding: (n, 32) float32 -> (float32 scale d (n, 1),
    unrounded; uint8 stored codes ``q`` in 0..2**bits - 1, value ``d * (q - 2**(bits-1))``)."""
    half = np.float32(1 << (bits - 1))
    first_largest = np.abs(blocks).argmax(axis=1)[:, None]
    m = np.take_along_axis(blocks, first_largest, axis=1)
    d = (m / -half).astype(np.float32)
    scaled = (blocks * _inverse(d)).astype(np.float32) + (half + np.float32(0.5))
    q = np.minimum(np.trunc(scaled), np.float32((1 << bits) - 1)).astype(np.uint8)
    return d, q


def ggml_block_codes(x: Any, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's Q4_0 (``bits=4``), Q5_0 (5) or Q8_0 (8) rounding in lowbit's terms.

    The same arithmetic as ggml's ``quantize_row_q4_0_ref`` / ``q5_0`` / ``q8_0``: the codes
    are computed with the unrounded float32 block scale, and the scale is then stored as
    float16, so ``scale * code`` is exactly what llama.cpp dequantizes (Q5_0 is Q4_0's rule
    with ``d = m / -16`` and codes 0..31).

    Args:
        x: real array whose last axis is a multiple of 32 (converted to float32 first).
        bits: 4, 5 or 8.

    Returns:
        ``(scale, codes)``: float32 scales (exact float16 values) of shape
        ``(*x.shape[:-1], x.shape[-1] // 32)`` and int8 signed codes of ``x``'s shape
        (-8..7, -16..15 or -127..127).

    Raises:
        LowbitError: bits not 4/5/8, rows not a multiple of 32, NaN/inf input, or a block
        scale beyond float16's range.
    """
    if bits not in (4, 5, 8):
        raise LowbitError(f"llama.cpp's Qn_0 block types are 4, 5 and 8 bits, got {bits}")
    name = f"Q{bits}_0"
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" and not _is_ml_float(arr.dtype):
        raise LowbitError(f"{name} quantizes real numbers, got an array of dtype {arr.dtype}")
    if arr.ndim == 0 or arr.shape[-1] % BLOCK != 0:
        raise LowbitError(
            f"{name} needs rows (last axis) that are a multiple of {BLOCK} values, "
            f"got shape {arr.shape}"
        )
    flat = arr.reshape(-1, BLOCK)
    scales = np.empty((flat.shape[0], 1), dtype=np.float32)
    codes = np.empty(flat.shape, dtype=np.int8)
    for start in range(0, flat.shape[0], _CHUNK):
        blocks = flat[start : start + _CHUNK].astype(np.float32)
        if not np.isfinite(blocks).all():
            raise LowbitError(f"{name} cannot hold NaN or infinity; the input has some")
        if bits == 8:
            d, q = _q8_0_core(blocks)
        else:
            d, u = _qn_0_core(blocks, bits)
            q = u.astype(np.int8) - np.int8(1 << (bits - 1))
        if np.any(np.abs(d) > _F16_MAX):
            raise LowbitError(f"{name} block scale overflows float16")
        scales[start : start + _CHUNK] = d.astype(np.float16)
        codes[start : start + _CHUNK] = q
    return scales.reshape(*arr.shape[:-1], -1), codes.reshape(arr.shape)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) codes 0..15 -> (n, 16) bytes: element j low nibble, element j+16 high nibble."""
    half = BLOCK // 2
    return (q[:, :half] | (q[:, half:] << np.uint8(4))).astype(np.uint8)


def _unpack_nibbles(b: np.ndarray) -> np.ndarray:
    return np.concatenate([b & np.uint8(0x0F), b >> np.uint8(4)], axis=1)


def _split(data: Any, qtype: str) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Raw blocks -> (float16 scales (n, 1), payload bytes (n, k), logical shape)."""
    raw = np.asarray(data)
    if raw.dtype != np.uint8:
        raise LowbitError(f"{qtype} data must be uint8 bytes, got dtype {raw.dtype}")
    size = _BLOCK_BYTES[qtype]
    if raw.ndim == 0 or raw.shape[-1] % size != 0:
        raise LowbitError(
            f"{qtype} rows must be a multiple of {size} bytes, got byte shape {raw.shape}"
        )
    blocks = np.ascontiguousarray(raw).reshape(-1, size)
    d = blocks[:, :2].copy().view(np.float16)
    shape = (*raw.shape[:-1], raw.shape[-1] // size * BLOCK)
    return d, blocks[:, 2:], shape


def q8_0_to_codes(data: Any) -> tuple[np.ndarray, np.ndarray]:
    """Split Q8_0 bytes into (float16 scales of shape (..., n_blocks), int8 codes of the values' shape)."""
    d, payload, shape = _split(data, "Q8_0")
    return d.reshape(*shape[:-1], -1), payload.view(np.int8).reshape(shape)


def q4_0_to_codes(data: Any) -> tuple[np.ndarray, np.ndarray]:
    """Split Q4_0 bytes into (float16 scales (..., n_blocks), int8 codes ``q - 8`` in -8..7)."""
    d, payload, shape = _split(data, "Q4_0")
    q = _unpack_nibbles(payload).astype(np.int8) - np.int8(8)
    return d.reshape(*shape[:-1], -1), q.reshape(shape)


def _dequantize_codes(d: np.ndarray, codes: np.ndarray) -> np.ndarray:
    shape = codes.shape
    scale = d.reshape(-1, 1).astype(np.float32)
    return (scale * codes.reshape(-1, BLOCK).astype(np.float32)).reshape(shape)


def dequantize_q8_0(data: Any) -> np.ndarray:
    """Q8_0 bytes -> float32 values ``d * q`` (one float32 product, as llama.cpp computes)."""
    return _dequantize_codes(*q8_0_to_codes(data))


def dequantize_q4_0(data: Any) -> np.ndarray:
    """Q4_0 bytes -> float32 values ``d * (q - 8)``."""
    return _dequantize_codes(*q4_0_to_codes(data))


def _from_codes(scale: Any, codes: Any, qtype: str, lo: int, hi: int) -> tuple[np.ndarray, ...]:
    c = np.asarray(codes)
    if c.dtype.kind not in "iu":
        raise LowbitError(f"{qtype} codes must be integers, got dtype {c.dtype}")
    if c.ndim == 0 or c.shape[-1] % BLOCK != 0:
        raise LowbitError(f"{qtype} rows must be a multiple of {BLOCK} codes, got shape {c.shape}")
    if c.size and (c.min() < lo or c.max() > hi):
        raise LowbitError(
            f"{qtype} codes must lie in {lo}..{hi}, got {int(c.min())}..{int(c.max())}"
        )
    n_blocks = c.size // BLOCK
    s = np.asarray(scale)
    if s.size != n_blocks:
        raise LowbitError(
            f"{qtype} needs one scale per block of {BLOCK} codes ({n_blocks}), got {s.size}"
        )
    s32 = s.astype(np.float32).reshape(-1, 1)
    s16 = s32.astype(np.float16)
    if not np.array_equal(s16.astype(np.float32), s32) or not np.isfinite(s16).all():
        raise LowbitError(
            f"{qtype} stores float16 scales; these scales are not all exact float16 values "
            "(quantize with scale_format='float16')"
        )
    return s16.view(np.uint8), c.astype(np.int16).reshape(-1, BLOCK), c.shape


def q8_0_from_codes(scale: Any, codes: Any) -> np.ndarray:
    """Build Q8_0 bytes from one float16-exact scale per 32 codes and int8 codes (-128..127).

    The result dequantizes (in llama.cpp, ``gguf`` or :func:`dequantize_q8_0`) to exactly
    ``float32(scale) * code``.

    Raises:
        LowbitError: codes out of range, a scale count that is not one per block, or scales
        that float16 cannot hold exactly.
    """
    d, c, shape = _from_codes(scale, codes, "Q8_0", -128, 127)
    out = np.concatenate([d, c.astype(np.int8).view(np.uint8)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // BLOCK * _BLOCK_BYTES["Q8_0"])


def q4_0_from_codes(scale: Any, codes: Any) -> np.ndarray:
    """Build Q4_0 bytes from one float16-exact scale per 32 codes and signed int4 codes (-8..7).

    The result dequantizes to exactly ``float32(scale) * code`` (stored nibble ``code + 8``).

    Raises:
        LowbitError: as for :func:`q8_0_from_codes`.
    """
    d, c, shape = _from_codes(scale, codes, "Q4_0", -8, 7)
    out = np.concatenate([d, _pack_nibbles((c + 8).astype(np.uint8))], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // BLOCK * _BLOCK_BYTES["Q4_0"])


def quantize(x: Any, qtype: str) -> np.ndarray:
    """Quantize ``x`` to ``qtype`` ("Q8_0" or "Q4_0", or a ``gguf.GGMLQuantizationType``)."""
    name = _qtype(qtype)
    return quantize_q8_0(x) if name == "Q8_0" else quantize_q4_0(x)


def dequantize(data: Any, qtype: str) -> np.ndarray:
    """Dequantize ``qtype`` bytes to float32 values (shape: rows of 32 values per block)."""
    name = _qtype(qtype)
    return dequantize_q8_0(data) if name == "Q8_0" else dequantize_q4_0(data)
