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


@njit(cache=True, nogil=True)
def _kquant_decode_kernel(raw, half, out, qtype):  # type: ignore[no-untyped-def]
    """Decode ``out.shape[0]`` K-quant super-blocks of ``raw`` (uint8 rows of one block each)
    into the float32 rows of 256 of ``out``, as ``lowbit.ggml.kquants``' numpy decoders do
    (qtype 2..6: Q2_K..Q6_K): the sub-block's scale ``d * sc`` and minimum ``dmin * m`` each
    rounded to float32, then ``scale * q`` and ``- min`` each rounded once. Returns False
    (``out`` unusable) when a block's ``d`` or ``dmin`` is not finite."""
    for i in range(out.shape[0]):
        b = raw[i]
        o = out[i]
        if qtype == 6:
            d = half[np.int64(b[208]) | (np.int64(b[209]) << 8)]
            if not np.isfinite(d):
                return False
            for h in range(2):
                for k in range(4):
                    for l in range(32):
                        c = b[h * 64 + (k & 1) * 32 + l]
                        low = np.int64(c & 15) if k < 2 else np.int64(c >> 4)
                        hb = (np.int64(b[128 + h * 32 + l]) >> (2 * k)) & 3
                        q = np.float32((low | (hb << 4)) - 32)
                        s = np.float32(np.int8(b[192 + h * 8 + k * 2 + l // 16]))
                        o[h * 128 + k * 32 + l] = np.float32(d * s) * q
        elif qtype == 3:
            d = half[np.int64(b[108]) | (np.int64(b[109]) << 8)]
            if not np.isfinite(d):
                return False
            for g in range(16):
                lo = np.int64(b[96 + g] & 15) if g < 8 else np.int64(b[96 + g - 8] >> 4)
                hi = (np.int64(b[104 + g % 4]) >> ((g // 4) * 2)) & 3
                dl = np.float32(d * np.float32((lo | (hi << 4)) - 32))
                for m in range(16):
                    j = g * 16 + m  # = h * 128 + k * 32 + l
                    h, k, l = j // 128, (j // 32) % 4, j % 32
                    q = (np.int64(b[32 + h * 32 + l]) >> (2 * k)) & 3
                    if (np.int64(b[l]) >> (j // 32)) & 1 == 0:
                        q -= 4
                    o[j] = dl * np.float32(q)
        elif qtype == 2:
            d = half[np.int64(b[80]) | (np.int64(b[81]) << 8)]
            dmin = half[np.int64(b[82]) | (np.int64(b[83]) << 8)]
            if not (np.isfinite(d) and np.isfinite(dmin)):
                return False
            for g in range(16):
                dl = np.float32(d * np.float32(b[g] & 15))
                ml = np.float32(dmin * np.float32(b[g] >> 4))
                for m in range(16):
                    j = g * 16 + m
                    h, k, l = j // 128, (j // 32) % 4, j % 32
                    q = np.float32((np.int64(b[16 + h * 32 + l]) >> (2 * k)) & 3)
                    o[j] = np.float32(dl * q) - ml
        else:  # 4 or 5: eight sub-blocks of 32 with 6-bit scales and minimums
            d = half[np.int64(b[0]) | (np.int64(b[1]) << 8)]
            dmin = half[np.int64(b[2]) | (np.int64(b[3]) << 8)]
            if not (np.isfinite(d) and np.isfinite(dmin)):
                return False
            qs = 16 if qtype == 4 else 48
            for g in range(8):
                if g < 4:
                    sc = np.int64(b[4 + g] & 63)
                    mn = np.int64(b[8 + g] & 63)
                else:
                    sc = np.int64(b[12 + g - 4] & 15) | (np.int64(b[4 + g - 4] >> 6) << 4)
                    mn = np.int64(b[12 + g - 4] >> 4) | (np.int64(b[8 + g - 4] >> 6) << 4)
                dl = np.float32(d * np.float32(sc))
                ml = np.float32(dmin * np.float32(mn))
                for l in range(32):
                    c = b[qs + (g // 2) * 32 + l]
                    q = np.int64(c & 15) if g % 2 == 0 else np.int64(c >> 4)
                    if qtype == 5:
                        q |= ((np.int64(b[16 + l]) >> g) & 1) << 4
                    o[g * 32 + l] = np.float32(dl * np.float32(q)) - ml
    return True
