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
from lowbit.ggml._search import (
    F32,
    f16_bytes,
    make_qkx_quants,
    make_qx_quants,
    nearest_int,
    read_f16,
    seqsum,
    to_f16,
)

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


def row_sigma2(rows: np.ndarray) -> np.ndarray:
    """Each row's mean square, summed in order as llama.cpp does: ``sigma2`` of the
    importance weights of Q4_0 / Q4_1 / Q5_0 / Q5_1 (``(R,)`` from rows ``(R, n)``)."""
    return seqsum(np.ascontiguousarray((rows * rows).T)) / F32(rows.shape[1])


def _weights(xs: np.ndarray, qw: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    """``qw * sqrt(sigma2 + x*x)``, ``sigma2`` the mean square of each block's row."""
    return qw * np.sqrt(sigma2[:, None] + xs * xs)


def fit_legacy(
    xs: np.ndarray, qtype: str, qw: np.ndarray | None = None, sigma2: np.ndarray | None = None
) -> dict:
    """The scale search of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 on blocks ``(B, 32)``: the block's
    scale (and minimum) and the rule its codes are rounded with (:func:`round_legacy`).

    Args:
        xs: float32 blocks.
        qtype: the type.
        qw: importance weights ``(B, 32)`` or None (llama.cpp's reference rounding).
        sigma2: with ``qw``, the mean square of each block's whole row ``(B,)``.
    """
    bits = 8 if qtype == "Q8_0" else 4 if qtype.startswith("Q4") else 5
    affine = qtype.endswith("_1")
    fit: dict = {"qtype": qtype}
    if qtype == "Q8_0":  # no importance (llama.cpp ignores it): legacy.py's rounding
        d = (np.abs(xs).max(axis=1) / F32(127)).astype(F32)
        fit.update(d=d, inv=legacy._inverse(d)[:, None])
    elif qw is None and affine:
        top = (1 << bits) - 1
        lo, hi = xs.min(axis=1), xs.max(axis=1)
        d = (hi - lo) / F32(top)
        fit.update(d=d, m=lo, inv=_inv(d)[:, None], lo=lo[:, None])
    elif qw is None:
        half = 1 << (bits - 1)
        d = (_signed_max(xs) / F32(-half)).astype(F32)
        inv = legacy._inverse(d) if bits == 4 else _inv(d)
        fit.update(d=d, inv=inv[:, None])
    else:
        assert sigma2 is not None
        w = np.ascontiguousarray(_weights(xs, qw, sigma2).T)
        xt = np.ascontiguousarray(xs.T)
        if affine:
            d, _, the_min, iscale, lo = make_qkx_quants(
                xt, w, (1 << bits) - 1, -0.9, 0.05, 36, False, True, rule=True
            )
            fit.update(d=d, m=-the_min, iscale=iscale[:, None], lo=lo[:, None])
        else:
            d, _, iscale = make_qx_quants(xt, 1 << (bits - 1), w, rule=True)
            fit.update(d=d, iscale=iscale[:, None])
    fit["d16"] = to_f16(fit["d"])[:, None]
    if "m" in fit:
        fit["m16"] = to_f16(fit["m"])[:, None]
    return fit


def round_legacy(fit: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns ``x (B, c)`` of blocks fitted by :func:`fit_legacy`, rounded as llama.cpp rounds
    them (with the unrounded float32 scale, or the inverse scale its search rounded with, so
    a code can differ from the nearest under the stored float16 scale), clamped to the codes
    the type stores. Returns (stored codes int64, values float32 as ggml decodes them)."""
    qtype = fit["qtype"]
    bits = 8 if qtype == "Q8_0" else 4 if qtype.startswith("Q4") else 5
    top, half = (1 << bits) - 1, 1 << (bits - 1)
    d16 = fit["d16"]
    if qtype == "Q8_0":
        q = np.clip(legacy._round_half_away(x * fit["inv"]), -128, 127).astype(np.int64)
        return q, d16 * q.astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        if "iscale" in fit and "lo" in fit:
            q = _clip_codes(nearest_int(fit["iscale"] * (x - fit["lo"])), top)
            q = np.where(fit["iscale"] == 0, 0, q)
        elif "iscale" in fit:
            q = np.clip(nearest_int(fit["iscale"] * x), -half, half - 1) + half
            q = np.where(fit["iscale"] == 0, 0, q)
        elif "lo" in fit:
            q = _clip_codes(_trunc_u8((x - fit["lo"]) * fit["inv"] + F32(0.5)), top)
        else:
            q = _clip_codes(_trunc_u8(x * fit["inv"] + F32(half + 0.5)), top)
    if "m16" in fit:
        return q, q.astype(F32) * d16 + fit["m16"]
    return q, (q - half).astype(F32) * d16


def _clip_codes(q: np.ndarray, top: int) -> np.ndarray:
    return np.clip(q, 0, top).astype(np.int64)


def pack_legacy(fit: dict, q: np.ndarray) -> np.ndarray:
    """Blocks ``(B, size)`` of the type of ``fit`` from its scales and stored codes ``(B, 32)``."""
    qtype = fit["qtype"]
    if qtype == "Q8_0":
        return np.concatenate([f16_bytes(fit["d"]), q.astype(np.int8).view(np.uint8)], axis=1)
    parts = [f16_bytes(fit["d"])]
    if "m" in fit:
        parts.append(f16_bytes(fit["m"]))
    if qtype.startswith("Q5"):
        parts.append(_qh(q))
    parts.append(_nibbles(q))
    return np.concatenate(parts, axis=1)


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
    # the reference rounding the scheme path and the GGUF writer use (with its kernels)
    if qtype == "Q8_0":
        return legacy.quantize_q8_0(xs)
    if qtype == "Q4_0" and qw is None:
        return legacy.quantize_q4_0(xs)
    sigma2 = None
    if qw is not None:
        assert n_per_row is not None
        sigma2 = np.repeat(row_sigma2(xs.reshape(-1, n_per_row)), n_per_row // 32)
    fit = fit_legacy(xs, qtype, qw, sigma2)
    return pack_legacy(fit, round_legacy(fit, xs)[0])


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
