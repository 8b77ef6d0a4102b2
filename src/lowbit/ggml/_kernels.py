"""The compiled kernels (numba) of llama.cpp's Q4_0 / Q4_1 / Q8_0 blocks, for ``lowbit.ggml._numba``.

Importing this module imports numba; ``lowbit.ggml._numba`` imports it on first use.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__: list[str] = []  # internal: used by lowbit.ggml._numba only

# Every operation is the numpy path's float32 operation on the same operands: a product and a
# sum are each rounded once (no fused multiply-add), and only finite scales reach the kernels
# (a NaN's payload could depend on operand order), so the bits are the numpy path's.


@njit(cache=True, nogil=True)
def _ggml_decode_kernel(raw, half, out, qtype):  # type: ignore[no-untyped-def]
    """Decode ``out.shape[0]`` blocks of ``raw`` (uint8 rows of one block each) into the
    float32 rows of ``out``: qtype 0 Q4_0 ``d * (q - 8)``, 1 Q4_1 ``d * q + m``, 2 Q8_0
    ``q * d``; ``half`` maps a float16 bit pattern to its float32 value. Returns False
    (``out`` unusable) when a block's scale or minimum is not finite."""
    for i in range(out.shape[0]):
        b = raw[i]
        d = half[np.int64(b[0]) | (np.int64(b[1]) << 8)]
        if not np.isfinite(d):
            return False
        o = out[i]
        if qtype == 2:
            for j in range(32):
                o[j] = np.float32(np.int8(b[2 + j])) * d
        elif qtype == 1:
            m = half[np.int64(b[2]) | (np.int64(b[3]) << 8)]
            if not np.isfinite(m):
                return False
            for j in range(16):
                c = b[4 + j]
                o[j] = np.float32(d * np.float32(c & 15)) + m
                o[j + 16] = np.float32(d * np.float32(c >> 4)) + m
        else:
            for j in range(16):
                c = b[2 + j]
                o[j] = d * np.float32(np.int64(c & 15) - 8)
                o[j + 16] = d * np.float32(np.int64(c >> 4) - 8)
    return True


@njit(cache=True, nogil=True)
def _ggml_encode_kernel(x, u, out, d, bits):  # type: ignore[no-untyped-def]
    """llama.cpp's reference Q4_0 (bits 4) or Q8_0 (bits 8) rounding of the float32 blocks
    ``x`` (n, 32; ``u`` their bits as uint32): the codes into ``out[:, 2:]`` (nibbles, or
    int8 bytes), the unrounded float32 scale into ``d``. Returns the index of the first
    block holding a NaN or an infinity (nothing after it is written), or -1."""
    mask = np.uint32(0x7FFFFFFF)
    for i in range(x.shape[0]):
        top = np.uint32(0)  # the largest magnitude's bits: integer max vectorises
        for j in range(32):
            top = max(top, u[i, j] & mask)
        if top >= np.uint32(0x7F800000):  # infinity's bits, or a NaN's
            return i
        first = 0  # its first index (numpy's argmax)
        for j in range(31, -1, -1):
            if u[i, j] & mask == top:
                first = j
        if bits == 8:
            s = np.float32(abs(x[i, first]) / np.float32(127))
        else:
            s = np.float32(x[i, first] * np.float32(-0.125))  # exactly m / -8
        d[i] = s
        inv = np.float32(0)  # 1/d, and 0 where that is not finite (numpy's _inverse)
        if s != 0:
            inv = np.float32(np.float32(1) / s)
            if not np.isfinite(inv):
                inv = np.float32(0)
        if bits == 8:
            for j in range(32):  # round half away from zero (_round_half_away)
                t = np.float32(x[i, j] * inv)
                a = abs(t)
                w = np.floor(a)
                w += np.float32(a - w >= np.float32(0.5))
                out[i, 2 + j] = np.uint8(np.int32(np.copysign(w, t)) & 255)
        else:
            for j in range(16):  # min(15, trunc(x / d + 8.5)), always positive
                lo = min(np.float32(np.float32(x[i, j] * inv) + np.float32(8.5)), np.float32(15))
                hi = np.float32(np.float32(x[i, j + 16] * inv) + np.float32(8.5))
                hi = min(hi, np.float32(15))
                out[i, 2 + j] = np.uint8(np.int32(lo)) | (np.uint8(np.int32(hi)) << np.uint8(4))
    return -1
