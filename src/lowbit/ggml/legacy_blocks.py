"""llama.cpp's 32-value block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, with and without importance.

Without an importance vector these are ggml's ``quantize_row_qN_M_ref`` (one pass from the
block's extreme values); with one, ``quantize_row_qN_M_impl`` (ggml-quants.c) searches the
scale: Q4_0/Q5_0 by ``make_qx_quants`` (symmetric, nmax 8/16), Q4_1/Q5_1 by
``make_qkx3_quants`` (scale and minimum), weighting value ``j`` by
``imatrix[j] * sqrt(sigma2 + x[j]**2)`` where ``sigma2`` is the mean square of the whole row.
Q8_0 ignores importance. Layouts (ggml-common.h), little-endian, per 32 values:

- Q4_0 (18): float16 ``d``, ``qs[16]``; Q4_1 (20): ``d``, float16 ``m``, ``qs[16]``;
- Q5_0 (22): ``d``, ``qh[4]``, ``qs[16]``; Q5_1 (24): ``d``, ``m``, ``qh[4]``, ``qs[16]``;
- Q8_0 (34): ``d``, 32 int8.

``qs`` byte ``j`` holds value ``j`` in its low nibble and value ``j + 16`` in its high nibble;
``qh`` (a little-endian uint32) holds the fifth bit of value ``j`` in bit ``j``. Values:
``d*(q-8)``, ``d*q + m``, ``d*(q-16)``, ``d*q + m``, ``d*q``.
"""

from __future__ import annotations

import numpy as np

from lowbit.ggml import legacy
from lowbit.ggml._search import F32, f16_bytes, make_qkx_quants, make_qx_quants, read_f16, seqsum

BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}


def _inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d != 0, F32(1) / d, F32(0)).astype(F32)


def _nibbles(q: np.ndarray) -> np.ndarray:
    q = q.astype(np.uint8)
    return (q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)


def _qh(q: np.ndarray) -> np.ndarray:
    bits = ((q.astype(np.uint32) >> 4) & 1) << np.arange(32, dtype=np.uint32)
    qh = np.bitwise_or.reduce(bits, axis=1).astype("<u4")
    return qh.view(np.uint8).reshape(-1, 4)


def _trunc_u8(v: np.ndarray) -> np.ndarray:
    """C's ``(int8_t)`` / ``(uint8_t)`` of a float in range: truncation toward zero."""
    return np.trunc(v).astype(np.int64)


def _signed_max(xs: np.ndarray) -> np.ndarray:
    idx = np.abs(xs).argmax(axis=1)
    return xs[np.arange(xs.shape[0]), idx]


def _ref_qn_0(xs: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    half = 1 << (bits - 1)
    d = _signed_max(xs) / F32(-half)
    q = np.minimum((1 << bits) - 1, _trunc_u8(xs * _inv(d)[:, None] + F32(half + 0.5)))
    return d, q


def _ref_qn_1(xs: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    top = (1 << bits) - 1
    lo, hi = xs.min(axis=1), xs.max(axis=1)
    d = (hi - lo) / F32(top)
    q = _trunc_u8((xs - lo[:, None]) * _inv(d)[:, None] + F32(0.5))
    if bits == 4:
        q = np.minimum(15, q)
    return d, lo, q


def _weights(xs: np.ndarray, qw: np.ndarray, n_per_row: int) -> np.ndarray:
    """``qw * sqrt(sigma2 + x*x)``, ``sigma2`` the row's mean square (sum in order)."""
    rows = xs.reshape(-1, n_per_row)
    sigma2 = seqsum(np.ascontiguousarray((rows * rows).T)) / F32(n_per_row)
    s2 = np.repeat(sigma2, n_per_row // 32)[:, None]
    return qw * np.sqrt(s2 + xs * xs)


def quantize_legacy(
    xs: np.ndarray, qtype: str, qw: np.ndarray | None = None, n_per_row: int | None = None
) -> np.ndarray:
    """Blocks ``(B, 32)`` float32 -> ``qtype`` bytes ``(B, size)``.

    Args:
        xs: the blocks, row after row (each row ``n_per_row`` values).
        qtype: "Q4_0", "Q4_1", "Q5_0", "Q5_1" or "Q8_0".
        qw: importance weights of the same shape (the vector repeated per row), or None.
        n_per_row: values per row (needed with ``qw``: ``sigma2`` is per row).
    """
    # Q8_0 (which ignores importance, as llama.cpp does) and plain Q4_0 are lowbit.ggml.legacy's,
    # the reference rounding the scheme path and the GGUF writer use (with its compiled kernels)
    if qtype == "Q8_0":
        return legacy.quantize_q8_0(xs)
    if qtype == "Q4_0" and qw is None:
        return legacy.quantize_q4_0(xs)
    bits = 4 if qtype.startswith("Q4") else 5
    affine = qtype.endswith("_1")
    m = None
    if qw is None:
        if affine:
            d, m, q = _ref_qn_1(xs, bits)
        else:
            d, q = _ref_qn_0(xs, bits)
    else:
        assert n_per_row is not None
        w = np.ascontiguousarray(_weights(xs, qw, n_per_row).T)
        xt = np.ascontiguousarray(xs.T)
        if affine:
            d, codes, the_min = make_qkx_quants(xt, w, (1 << bits) - 1, -0.9, 0.05, 36, False, True)
            m = -the_min
        else:
            d, codes = make_qx_quants(xt, 1 << (bits - 1), w)
        q = codes.T
    parts = [f16_bytes(d)]
    if m is not None:
        parts.append(f16_bytes(m))
    if bits == 5:
        parts.append(_qh(q))
    parts.append(_nibbles(q))
    return np.concatenate(parts, axis=1)


def dequantize_legacy(b: np.ndarray, qtype: str) -> np.ndarray:
    """``qtype`` bytes ``(B, size)`` -> float32 ``(B, 32)``, as ggml's ``dequantize_row_*``."""
    d = read_f16(b, 0)[:, None]
    if qtype == "Q8_0":
        return d * b[:, 2:].view(np.int8).astype(F32)
    affine = qtype.endswith("_1")
    off = 4 if affine else 2
    m = read_f16(b, 2)[:, None] if affine else None
    q = None
    if qtype.startswith("Q5"):
        qh = b[:, off : off + 4].copy().view("<u4").astype(np.uint32)
        high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32) << 4
        off += 4
    else:
        high = 0
    qs = b[:, off : off + 16]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int32) | high
    if affine:
        return q.astype(F32) * d + m
    return (q - (16 if qtype.startswith("Q5") else 8)).astype(F32) * d
