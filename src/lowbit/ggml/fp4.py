"""GGUF's FP4 blocks, MXFP4 and NVFP4, as llama.cpp writes them: blocks to bytes and back.

Both store E2M1 codes as indices into ``kvalues_mxfp4`` = 0, 1, 2, 3, 4, 6, 8, 12, -0, -1, ...,
-12 (twice the E2M1 values) and a block scale decoded at *half* its value, so that a code's
value is ``kvalues[q] * scale / 2`` = E2M1 value times scale. The code of each value is the
first table entry with the least ``|kvalues[i] * d - x|`` (``best_index_mxfp4``, float32), so
zero gets code 0, never 8. Layouts (ggml-common.h at the fixtures' commit), little-endian:

- MXFP4, 17 bytes per 32 values: E8M0 exponent ``e`` (scale ``2**(e-127)``), ``qs[16]`` (byte
  ``j``: value ``j`` low nibble, value ``j + 16`` high nibble). ``e = floor(log2(amax)) - 2 + 127``
  (0 for an all-zero block).
- NVFP4, 36 bytes per 64 values: four UE4M3 scales ``d[4]`` (one per 16 values, unsigned E4M3,
  bias 7, code 0x7F read as 0), then ``qs[32]``: bytes ``8s..8s+7`` hold sub-block ``s``, byte
  ``8s + j`` value ``16s + j`` low nibble and ``16s + 8 + j`` high nibble. Scale =
  ``ggml_fp32_to_ue4m3(amax / 6)``: clamped to 448, the top three mantissa bits rounded half up
  on the fourth (not to even), subnormals ``trunc(x * 512 + 0.5)``. No per-tensor scale.
"""

from __future__ import annotations

import numpy as np

from lowbit.ggml._search import F32

KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12])
"""``kvalues_mxfp4``: E2M1 values doubled, indexed by the 4-bit code."""


def _best_index(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``best_index_mxfp4(x, d)``: first code with the least ``|kvalues[i]*d - x|``."""
    k = KVALUES_MXFP4.astype(F32)
    errs = np.abs(k[:, None] * d.reshape(1, -1) - x.reshape(1, -1))
    return errs.argmin(axis=0).reshape(x.shape).astype(np.uint8)


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """``GGML_E8M0_TO_FP32_HALF``: half of ``2**(e-127)``, exactly (subnormal for e < 2)."""
    e = np.asarray(e).astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23))
    return bits.astype(np.uint32).view(F32)


def _pack(codes: np.ndarray, n: int) -> np.ndarray:
    """(B, k*n) codes -> (B, k*n/2): per n values, byte j = value j | value j + n/2 << 4."""
    c = codes.reshape(codes.shape[0], -1, 2, n // 2)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(codes.shape[0], -1)


def _unpack(b: np.ndarray, n: int) -> np.ndarray:
    b = b.reshape(b.shape[0], -1, 1, n // 2)
    return np.concatenate([b & 0xF, b >> 4], axis=2).reshape(b.shape[0], -1)


def quantize_mxfp4(xs: np.ndarray) -> np.ndarray:
    """Blocks ``(B, 32)`` float32 -> MXFP4 bytes ``(B, 17)``."""
    amax = np.abs(xs).max(axis=1)
    with np.errstate(divide="ignore"):
        # log2f, correctly rounded to float32 as glibc's is, then floorf
        lg = np.log2(amax.astype(np.float64)).astype(F32)
    e = np.where(amax > 0, np.floor(lg) - F32(2) + F32(127), F32(0))
    e = (np.nan_to_num(e).astype(np.int64) & 0xFF).astype(np.uint8)  # C's (uint8_t)(float)
    d = e8m0_to_fp32_half(e)
    codes = _best_index(xs, np.repeat(d[:, None], 32, axis=1))
    return np.concatenate([e[:, None], _pack(codes, 32)], axis=1)


def dequantize_mxfp4(b: np.ndarray) -> np.ndarray:
    """MXFP4 bytes ``(B, 17)`` -> float32 ``(B, 32)``."""
    d = e8m0_to_fp32_half(b[:, 0])
    return d[:, None] * KVALUES_MXFP4.astype(F32)[_unpack(b[:, 1:], 32)]


def fp32_to_ue4m3(x: np.ndarray) -> np.ndarray:
    """``ggml_fp32_to_ue4m3``: float32 -> unsigned E4M3 code (see the module docstring)."""
    x = np.asarray(x, dtype=F32)
    pos = x > 0
    x = np.minimum(np.where(pos, x, F32(0)), F32(448)).astype(F32)
    bits = x.view(np.uint32).astype(np.int64)
    e = ((bits >> 23) & 0xFF) - 127 + 7
    man = (bits >> 20) & 7
    sub = (x * F32(512) + F32(0.5)).astype(np.int64)
    sub = np.where(sub < 1, 0, np.minimum(sub, 7))
    m = man + ((bits >> 19) & 1)
    carry = m > 7
    m = np.where(carry, 0, m)
    e2 = np.where(carry, e + 1, e)
    normal = np.where(e2 >= 15, 0x7E, (e2 << 3) | m)
    code = np.where(e <= 0, sub, np.where(e >= 15, 0x7E, normal))
    return np.where(pos, code, 0).astype(np.uint8)


def ue4m3_to_fp32_half(c: np.ndarray) -> np.ndarray:
    """``ggml_ue4m3_to_fp32``: half the UE4M3 value of code ``c`` (0x7F and 0 give 0)."""
    c = np.asarray(c).astype(np.int64)
    exp = (c >> 3) & 0xF
    man = (c & 7).astype(np.float64)
    raw = np.where(exp == 0, man * 2.0**-9, (1 + man / 8) * np.exp2(exp - 7.0))
    return np.where((c == 0) | (c == 0x7F), 0.0, raw * 0.5).astype(F32)


def quantize_nvfp4(xs: np.ndarray) -> np.ndarray:
    """Blocks ``(B, 64)`` float32 -> NVFP4 bytes ``(B, 36)``."""
    nb = xs.shape[0]
    sub = xs.reshape(nb * 4, 16)
    amax = np.abs(sub).max(axis=1)
    ue = fp32_to_ue4m3(amax / F32(6))
    d = ue4m3_to_fp32_half(ue)
    codes = _best_index(sub, np.repeat(d[:, None], 16, axis=1))
    qs = _pack(codes, 16).reshape(nb, 32)
    return np.concatenate([ue.reshape(nb, 4), qs], axis=1)


def dequantize_nvfp4(b: np.ndarray) -> np.ndarray:
    """NVFP4 bytes ``(B, 36)`` -> float32 ``(B, 64)``."""
    nb = b.shape[0]
    d = ue4m3_to_fp32_half(b[:, :4]).reshape(nb * 4, 1)
    q = KVALUES_MXFP4.astype(F32)[_unpack(b[:, 4:].reshape(nb * 4, 8), 16)]
    return (d * q).reshape(nb, 64)
