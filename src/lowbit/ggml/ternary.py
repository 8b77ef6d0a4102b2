"""llama.cpp's ternary types TQ1_0 and TQ2_0 (BitNet b1.58, TriLM): blocks to bytes and back.

Both keep one float16 scale ``d = max|x|`` per 256 values and a trit ``lroundf(x / d)`` in
-1, 0, 1 per value (``quantize_row_tq1_0_ref`` / ``tq2_0_ref``, ggml-quants.c; importance
vectors are ignored). Layouts (ggml-common.h), little-endian:

- TQ2_0, 66 bytes: ``qs[64]`` (byte ``32c + m`` holds trit+1 of value ``128c + 32n + m`` in bits
  ``2n..2n+1``), float16 ``d``.
- TQ1_0, 54 bytes: ``qs[48]``, ``qh[4]``, float16 ``d``. Five trits per byte in base 3, first
  trit most significant, stored as ``ceil(t * 256 / 243)`` (so ``(byte * 3**n * 3) >> 8`` on a
  uint8 product reads trit ``n``): bytes 0..31 hold values ``m + 32n`` (n < 5), bytes 32..47
  values ``160 + m + 16n``, and ``qh[j]`` four trits of values ``240 + j + 4n`` (n < 4)
  shifted up one trit.
"""

from __future__ import annotations

import numpy as np

from lowbit.ggml._search import F32, f16_bytes, read_f16

_POW3 = np.array([1, 3, 9, 27, 81, 243], dtype=np.uint8)


def _trits(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d (B,), trits + 1 (B, 256) in 0..2)."""
    d = np.abs(xs).max(axis=1)
    with np.errstate(divide="ignore"):
        ident = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    v = xs * ident[:, None]
    a = np.abs(v)
    whole = np.floor(a)
    r = np.copysign(whole + ((a - whole) >= F32(0.5)), v)  # lroundf: ties away from zero, exact
    return d, (r.astype(np.int64) + 1)


def _base3(t: np.ndarray, axis: int) -> np.ndarray:
    """Trits along ``axis`` (first most significant) -> ceil(value * 256 / 243) as uint8."""
    q = np.zeros(np.delete(t.shape, axis), dtype=np.int64)
    for k in range(t.shape[axis]):
        q = q * 3 + np.take(t, k, axis=axis)
    return q


def _ceil243(q: np.ndarray) -> np.ndarray:
    return ((q * 256 + 242) // 243).astype(np.uint8)


def quantize_tq1_0(xs: np.ndarray) -> np.ndarray:
    """Super-blocks ``(B, 256)`` float32 -> TQ1_0 bytes ``(B, 54)``."""
    nb = xs.shape[0]
    d, t = _trits(xs)
    a = _ceil243(_base3(t[:, :160].reshape(nb, 5, 32), 1))
    b = _ceil243(_base3(t[:, 160:240].reshape(nb, 5, 16), 1))
    h = _ceil243(_base3(t[:, 240:].reshape(nb, 4, 4), 1) * 3)
    return np.concatenate([a, b, h, f16_bytes(d)], axis=1)


def quantize_tq2_0(xs: np.ndarray) -> np.ndarray:
    """Super-blocks ``(B, 256)`` float32 -> TQ2_0 bytes ``(B, 66)``."""
    nb = xs.shape[0]
    d, t = _trits(xs)
    t = t.reshape(nb, 2, 4, 32).astype(np.uint8)
    qs = t[:, :, 0] | (t[:, :, 1] << 2) | (t[:, :, 2] << 4) | (t[:, :, 3] << 6)
    return np.concatenate([qs.reshape(nb, 64), f16_bytes(d)], axis=1)


def _read_trits(b: np.ndarray, n: int) -> np.ndarray:
    """(B, m) bytes -> (B, n, m) trits + 1: trit k of each byte, first most significant."""
    q = (b[:, None, :] * _POW3[:n, None]).astype(np.uint8)  # uint8 products wrap, as in C
    return (q.astype(np.uint16) * 3) >> 8


def dequantize_tq1_0(b: np.ndarray) -> np.ndarray:
    """TQ1_0 bytes ``(B, 54)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    d = read_f16(b, 52)
    t = np.concatenate(
        [
            _read_trits(b[:, :32], 5).reshape(nb, 160),
            _read_trits(b[:, 32:48], 5).reshape(nb, 80),
            _read_trits(b[:, 48:52], 4).reshape(nb, 16),
        ],
        axis=1,
    )
    return (t.astype(F32) - F32(1)) * d[:, None]


def dequantize_tq2_0(b: np.ndarray) -> np.ndarray:
    """TQ2_0 bytes ``(B, 66)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    d = read_f16(b, 64)
    qs = b[:, :64].reshape(nb, 2, 1, 32)
    t = (qs >> (np.arange(4, dtype=np.uint8) * 2)[None, None, :, None]) & 3
    return (t.reshape(nb, 256).astype(F32) - F32(1)) * d[:, None]
