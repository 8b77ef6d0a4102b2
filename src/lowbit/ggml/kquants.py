"""llama.cpp's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): super-blocks of 256 values to bytes and back.

Each encoder takes super-blocks as a float32 array of shape ``(B, 256)`` and, optionally, the
importance weights of those 256 columns (``(B, 256)``, the importance vector repeated for
every row); it returns ``(B, block bytes)`` uint8, the bytes ``ggml_quantize_chunk`` writes:
without weights llama.cpp's ``quantize_row_qN_K_ref``, with them ``quantize_row_qN_K_impl``
(ggml-quants.c). Block layouts (ggml-common.h), all little-endian:

- Q2_K, 84 bytes: ``scales[16]`` (low nibble scale, high nibble min, per 16 values),
  ``qs[64]`` (2-bit codes: byte ``32*h + l`` holds values ``128*h + l + 32*k`` in bits
  ``2k..2k+1``), float16 ``d``, float16 ``dmin``; value ``d*sc*q - dmin*m``.
- Q3_K, 110 bytes: ``hmask[32]`` (bit ``k`` of byte ``l`` is the high bit of value
  ``32*k + l``), ``qs[64]`` (low 2 bits as Q2_K), ``scales[12]`` (sixteen 6-bit scales),
  float16 ``d``; value ``d*(sc-32)*(q-4)``.
- Q4_K, 144 bytes: float16 ``d``, float16 ``dmin``, ``scales[12]`` (eight 6-bit scales and
  eight 6-bit mins), ``qs[128]`` (byte ``32*h + l``: value ``64*h + l`` low nibble, value
  ``64*h + 32 + l`` high nibble); value ``d*sc*q - dmin*m``.
- Q5_K, 176 bytes: as Q4_K with ``qh[32]`` before ``qs`` (bit ``2h`` / ``2h+1`` of byte ``l``:
  the fifth bit of value ``64*h + l`` / ``64*h + 32 + l``).
- Q6_K, 210 bytes: ``ql[128]``, ``qh[64]``, int8 ``scales[16]``, float16 ``d``; value
  ``d*sc*(q-32)``.
"""

from __future__ import annotations

import numpy as np

from lowbit.ggml import _search
from lowbit.ggml._search import (
    F32,
    GROUP_MAX_EPS,
    f16_bytes,
    first_absmax,
    make_q3_quants,
    make_qkx_quants,
    make_qp_quants,
    make_qx_quants,
    nearest_int,
    read_f16,
    seqsum,
    to_f16,
)

QK_K = 256
BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def _cols(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` cut into groups of ``n`` consecutive values, one group per column: ``(n, G)``."""
    return np.ascontiguousarray(a.reshape(-1, n).T)


def _rows(a: np.ndarray, nb: int) -> np.ndarray:
    """Inverse of :func:`_cols`: ``(n, G)`` back to ``(nb, G*n/nb)``."""
    return np.ascontiguousarray(a.T).reshape(nb, -1)


def _sigma2(xs: np.ndarray, factor: float) -> np.ndarray:
    """``factor * sum(x*x) / 256`` per super-block (sum in order), shape ``(B, 1)``."""
    s = seqsum(_cols(xs * xs, QK_K))
    return (F32(factor) * s / F32(QK_K))[:, None] if factor != 1 else (s / F32(QK_K))[:, None]


def _imatrix_weights(xs: np.ndarray, qw: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    return qw * np.sqrt(sigma2 + xs * xs)


def _pack2(q: np.ndarray) -> np.ndarray:
    """(B, 256) 2-bit codes -> (B, 64): byte ``32h + l`` = values ``128h + l + 32k`` at bits 2k."""
    q = q.astype(np.uint8).reshape(-1, 2, 4, 32)
    out = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    return out.reshape(-1, 64)


def _unpack2(b: np.ndarray) -> np.ndarray:
    b = b.reshape(-1, 2, 1, 32)
    return ((b >> (np.arange(4, dtype=np.uint8) * 2)[None, None, :, None]) & 3).reshape(-1, 256)


def _pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins (uint8 (B, 8)) -> the 12 bytes of Q4_K/Q5_K."""
    ls = ls.astype(np.uint8)
    lm = lm.astype(np.uint8)
    out = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4]
    out[:, 4:8] = lm[:, 0:4]
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    out[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    out[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    return out


def _unpack_scales_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes of Q4_K/Q5_K -> (scales, mins), each uint8 (B, 8) (get_scale_min_k4)."""
    sc = np.empty((s.shape[0], 8), dtype=np.uint8)
    mn = np.empty((s.shape[0], 8), dtype=np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _pack_scales_q3(l6: np.ndarray) -> np.ndarray:
    """Sixteen 6-bit scales (uint8 (B, 16), 0..63) -> Q3_K's 12 bytes."""
    l6 = l6.astype(np.uint8)
    out = np.zeros((l6.shape[0], 12), dtype=np.uint8)
    out[:, :8] = (l6[:, :8] & 0xF) | ((l6[:, 8:] & 0xF) << 4)
    hi = (l6 >> 4).reshape(-1, 4, 4)  # [j // 4, j % 4]
    out[:, 8:] = hi[:, 0] | (hi[:, 1] << 2) | (hi[:, 2] << 4) | (hi[:, 3] << 6)
    return out


def _unpack_scales_q3(s: np.ndarray) -> np.ndarray:
    """Q3_K's 12 scale bytes -> int32 (B, 16) scales minus 32."""
    low = np.concatenate([s[:, :8] & 0xF, s[:, :8] >> 4], axis=1).astype(np.int32)
    shifts = (np.arange(16) // 4) * 2
    high = (s[:, 8 + np.arange(16) % 4] >> shifts.astype(np.uint8)) & 3
    return (low | (high.astype(np.int32) << 4)) - 32


def _group_of(a: np.ndarray, n: int, j: int, c: int) -> np.ndarray:
    """``a`` (B, groups) spread over columns ``j .. j+c`` of the block (groups of ``n``)."""
    return a[:, (j + np.arange(c)) // n]


def round_affine(
    fit: dict, n: int, nmax: int, j: int, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Q2_K / Q4_K / Q5_K's final rounding of columns ``j .. j+c`` of the block, ``x (B, c)``:
    code ``clamp(nearest_int((x + dm) / d), 0, nmax)`` on the group's stored ``d = d*sc`` and
    ``dm = dmin*m`` (the nearest grid point), the search's code where ``d`` is 0 (C's
    ``if (!d) continue``). Returns (codes int32, values ``d*q - dm`` float32 as ggml decodes)."""
    c = x.shape[1]
    d = _group_of(fit["dd"], n, j, c)
    dm = _group_of(fit["dm"], n, j, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(nearest_int((x + dm) / d), 0, nmax)
    q = np.where(d == 0, fit["codes"][:, j : j + c], q)
    return q, d * q.astype(F32) - dm


def round_symmetric(
    fit: dict, n: int, half: int, j: int, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Q3_K (``half`` 4) / Q6_K (32)'s final rounding of columns ``j .. j+c``: stored code
    ``clamp(nearest_int(x / d), -half, half-1) + half`` on the group's ``d = d*sc``, the
    search's code where ``d`` is 0. Returns (codes, values ``d*(q - half)`` float32)."""
    c = x.shape[1]
    d = _group_of(fit["dd"], n, j, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(nearest_int(x / d), -half, half - 1) + half
    q = np.where(d == 0, fit["codes"][:, j : j + c], q)
    return q, d * (q - half).astype(F32)


def _codes(fit: dict, n: int, k: int, xs: np.ndarray, affine: bool) -> np.ndarray:
    """The codes of :func:`round_affine` (``k`` = nmax) or :func:`round_symmetric` (``k`` =
    half) on whole super-blocks, compiled where the searches are (the same bits)."""
    if _search._use_kernels(xs.size):
        dm = fit["dm"] if affine else fit["dd"]
        lo = 0 if affine else -k
        hi = k if affine else k - 1
        return _search._k().grid_codes(
            np.ascontiguousarray(xs, dtype=F32), fit["dd"], dm, fit["codes"], n, lo, hi, affine
        )
    return (round_affine if affine else round_symmetric)(fit, n, k, 0, xs)[0]


# ---------------------------------------------------------------------------- Q2_K


def _fit_q2_k(xs: np.ndarray, qw: np.ndarray | None) -> dict:
    """Q2_K's scale search on super-blocks ``(B, 256)``: the grid its codes are rounded onto."""
    nb = xs.shape[0]
    xt = _cols(xs, 16)
    if qw is None:
        scales, codes, mins = make_qkx_quants(xt, np.abs(xt), 3, -0.5, 0.1, 15, True, x3=False)
        scales, mins = scales.reshape(nb, 16), mins.reshape(nb, 16)
        max_scale = np.maximum(scales.max(axis=1), F32(0))
        max_min = np.maximum(mins.max(axis=1), F32(0))
        with np.errstate(divide="ignore", invalid="ignore"):
            ls = nearest_int((F32(15) / max_scale)[:, None] * scales) & 0xFF
            lm = nearest_int((F32(15) / max_min)[:, None] * mins) & 0xFF
        ls = np.where((max_scale > 0)[:, None], ls, 0)
        lm = np.where((max_min > 0)[:, None], lm, 0)
        sbytes = (ls | (lm << 4)) & 0xFF
        d = np.where(max_scale > 0, max_scale / F32(15), F32(0))
        dmin = np.where(max_min > 0, max_min / F32(15), F32(0))
    else:
        w = _imatrix_weights(xs, qw, _sigma2(xs, 1))
        wt = _cols(w, 16)
        scales, codes, mins = make_qkx_quants(xt, wt, 3, -0.9, 0.05, 36, False, x3=True)
        sw = _cols(seqsum(wt).reshape(nb, 16), 16)
        dm, ls = make_qp_quants(_cols(scales, 16), 15, sw)
        mm, lm = make_qp_quants(_cols(mins, 16), 15, sw)
        sbytes = (_rows(ls, nb) | (_rows(lm, nb) << 4)) & 0xFF
        d, dmin = dm, mm
    d16, dmin16 = to_f16(d), to_f16(dmin)
    sbytes = sbytes.astype(np.uint8)
    dd = d16[:, None] * (sbytes & 0xF).astype(F32)
    mm_ = dmin16[:, None] * (sbytes >> 4).astype(F32)
    return {"dd": dd, "dm": mm_, "codes": _rows(codes, nb), "head": (sbytes, d, dmin)}


def _pack_q2_k(fit: dict, q: np.ndarray) -> np.ndarray:
    sbytes, d, dmin = fit["head"]
    return np.concatenate([sbytes, _pack2(q), f16_bytes(d), f16_bytes(dmin)], axis=1)


def quantize_q2_k(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` -> Q2_K bytes ``(B, 84)``."""
    fit = _fit_q2_k(xs, qw)
    return _pack_q2_k(fit, _codes(fit, 16, 3, xs, True))


def dequantize_q2_k(b: np.ndarray) -> np.ndarray:
    """Q2_K bytes ``(B, 84)`` -> float32 ``(B, 256)``."""
    sc = b[:, :16]
    d = read_f16(b, 80)
    dmin = read_f16(b, 82)
    q = _unpack2(b[:, 16:80]).reshape(-1, 16, 16).astype(F32)
    dl = (d[:, None] * (sc & 0xF).astype(F32))[..., None]
    ml = (dmin[:, None] * (sc >> 4).astype(F32))[..., None]
    return (dl * q - ml).reshape(-1, 256)


# ---------------------------------------------------------------------------- Q3_K


def _fit_q3_k(xs: np.ndarray, qw: np.ndarray | None) -> dict:
    """Q3_K's scale search on super-blocks ``(B, 256)``."""
    nb = xs.shape[0]
    xt = _cols(xs, 16)
    if qw is None:
        scales, codes = make_q3_quants(xt, 4)
        scales = scales.reshape(nb, 16)
        _, max_scale = first_absmax(scales.T)
        nz = max_scale != 0
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = F32(-32) / max_scale
            lint = nearest_int(iscale[:, None] * scales)
        l8 = ((lint + 128) & 0xFF) - 128  # stored in an int8_t
        l6 = np.where(nz[:, None], np.clip(l8, -32, 31) + 32, 0)
        with np.errstate(divide="ignore"):
            d = np.where(nz, F32(1) / iscale, F32(0))
    else:
        w = _imatrix_weights(xs, qw, _sigma2(xs, 2))
        wt = _cols(w, 16)
        scales, codes = make_qx_quants(xt, 4, wt)
        sw = _cols(seqsum(wt).reshape(nb, 16), 16)
        d, ls = make_qx_quants(_cols(scales, 16), 32, sw)
        l6 = _rows(ls, nb)
    sbytes = _pack_scales_q3(l6)
    d16 = to_f16(d)
    dd = d16[:, None] * _unpack_scales_q3(sbytes).astype(F32)
    return {"dd": dd, "codes": _rows(codes, nb), "head": (sbytes, d)}


def quantize_q3_k(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` -> Q3_K bytes ``(B, 110)``."""
    fit = _fit_q3_k(xs, qw)
    return _pack_q3_k(fit, _codes(fit, 16, 4, xs, False))


def _pack_q3_k(fit: dict, q: np.ndarray) -> np.ndarray:
    sbytes, d = fit["head"]
    nb = q.shape[0]
    high = (q > 3).astype(np.uint8).reshape(nb, 8, 32)
    hmask = np.zeros((nb, 32), dtype=np.uint8)
    for k in range(8):
        hmask |= high[:, k] << k
    low = np.where(q > 3, q - 4, q)
    return np.concatenate([hmask, _pack2(low), sbytes, f16_bytes(d)], axis=1)


def dequantize_q3_k(b: np.ndarray) -> np.ndarray:
    """Q3_K bytes ``(B, 110)`` -> float32 ``(B, 256)``."""
    hmask, qs, sc = b[:, :32], b[:, 32:96], b[:, 96:108]
    d = read_f16(b, 108)
    low = _unpack2(qs).astype(np.int32)
    high = ((hmask[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).reshape(-1, 256)
    q = (low - np.where(high == 1, 0, 4)).astype(F32).reshape(-1, 16, 16)
    dl = (d[:, None] * _unpack_scales_q3(sc).astype(F32))[..., None]
    return (dl * q).reshape(-1, 256)


# ---------------------------------------------------------------------------- Q4_K / Q5_K


def _qk45(xs: np.ndarray, qw: np.ndarray | None, nmax: int) -> dict:
    """The scale search shared by Q4_K (nmax 15) and Q5_K (31): the grid of each sub-block."""
    nb = xs.shape[0]
    xt = _cols(xs, 32)
    if qw is None:
        av_x = np.sqrt(seqsum(xt * xt) / F32(32))
        weights = av_x[None, :] + np.abs(xt)
        rmin, nstep = (-1.0, 20) if nmax == 15 else (-0.5, 15)
        scales, codes, mins = make_qkx_quants(xt, weights, nmax, rmin, 0.1, nstep, False, False)
        scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
        max_scale = np.maximum(scales.max(axis=1), F32(0))
        max_min = np.maximum(mins.max(axis=1), F32(0))
        with np.errstate(divide="ignore"):
            inv_s = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
            inv_m = np.where(max_min > 0, F32(63) / max_min, F32(0))
        ls = np.minimum(63, nearest_int(inv_s[:, None] * scales) & 0xFF)
        lm = np.minimum(63, nearest_int(inv_m[:, None] * mins) & 0xFF)
        d, dmin = max_scale / F32(63), max_min / F32(63)
    else:
        sigma2 = _sigma2(xs, 2)
        wt = _cols(_imatrix_weights(xs, qw, sigma2), 32)
        scales, codes, mins = make_qkx_quants(xt, wt, nmax, -0.9, 0.05, 36, False, x3=True)
        sw = _cols(seqsum(wt).reshape(nb, 8), 8)
        d, ls = make_qp_quants(_cols(scales, 8), 63, sw)
        dmin, lm = make_qp_quants(_cols(mins, 8), 63, sw)
        ls, lm = _rows(ls, nb), _rows(lm, nb)
        if nmax == 31:
            ls, lm = np.minimum(63, ls), np.minimum(63, lm)
    sbytes = _pack_scales_k4(ls, lm)
    d16, dmin16 = to_f16(d), to_f16(dmin)
    sc, mn = _unpack_scales_k4(sbytes)
    dd = d16[:, None] * sc.astype(F32)
    dm = dmin16[:, None] * mn.astype(F32)
    return {"dd": dd, "dm": dm, "codes": _rows(codes, nb), "head": (d, dmin, sbytes)}


def _fit_q4_k(xs: np.ndarray, qw: np.ndarray | None) -> dict:
    """Q4_K's scale search on super-blocks ``(B, 256)``."""
    return _qk45(xs, qw, 15)


def _fit_q5_k(xs: np.ndarray, qw: np.ndarray | None) -> dict:
    """Q5_K's scale search on super-blocks ``(B, 256)``."""
    return _qk45(xs, qw, 31)


def _pack_q4_k(fit: dict, q: np.ndarray) -> np.ndarray:
    d, dmin, sbytes = fit["head"]
    q = q.astype(np.uint8).reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), sbytes, qs], axis=1)


def quantize_q4_k(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` -> Q4_K bytes ``(B, 144)``."""
    fit = _qk45(xs, qw, 15)
    return _pack_q4_k(fit, _codes(fit, 32, 15, xs, True))


def quantize_q5_k(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` -> Q5_K bytes ``(B, 176)``."""
    fit = _qk45(xs, qw, 31)
    return _pack_q5_k(fit, _codes(fit, 32, 31, xs, True))


def _pack_q5_k(fit: dict, q: np.ndarray) -> np.ndarray:
    d, dmin, sbytes = fit["head"]
    q = q.astype(np.uint8).reshape(-1, 4, 2, 32)
    low = q & 0xF
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    hi = q >> 4  # (B, 4, 2, 32)
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for h in range(4):
        qh |= (hi[:, h, 0] << (2 * h)) | (hi[:, h, 1] << (2 * h + 1))
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), sbytes, qh, qs], axis=1)


def _dequantize_k45(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    d = read_f16(b, 0)
    dmin = read_f16(b, 2)
    sc, mn = _unpack_scales_k4(b[:, 4:16])
    dl = (d[:, None] * sc.astype(F32))[..., None]
    ml = (dmin[:, None] * mn.astype(F32))[..., None]
    return (dl * q.reshape(-1, 8, 32).astype(F32) - ml).reshape(-1, 256)


def dequantize_q4_k(b: np.ndarray) -> np.ndarray:
    """Q4_K bytes ``(B, 144)`` -> float32 ``(B, 256)``."""
    qs = b[:, 16:144].reshape(-1, 4, 1, 32)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2)
    return _dequantize_k45(b, q)


def dequantize_q5_k(b: np.ndarray) -> np.ndarray:
    """Q5_K bytes ``(B, 176)`` -> float32 ``(B, 256)``."""
    qh = b[:, 16:48]
    qs = b[:, 48:176].reshape(-1, 4, 1, 32)
    low = np.concatenate([qs & 0xF, qs >> 4], axis=2)  # (B, 4, 2, 32)
    bits = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # (B, 8, 32)
    q = low | (bits.reshape(-1, 4, 2, 32) << 4)
    return _dequantize_k45(b, q)


# ---------------------------------------------------------------------------- Q6_K


def _fit_q6_k(xs: np.ndarray, qw: np.ndarray | None) -> dict:
    """Q6_K's scale search on super-blocks ``(B, 256)``."""
    nb = xs.shape[0]
    xt = _cols(xs, 16)
    scales, codes = make_qx_quants(xt, 32, None if qw is None else _cols(qw, 16))
    scales = scales.reshape(nb, 16)
    max_abs, max_scale = first_absmax(scales.T)
    zero = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-128) / max_scale
        d = F32(1) / iscale
        sc = np.minimum(127, nearest_int(iscale[:, None] * scales))
    sc8 = (((sc + 128) & 0xFF) - 128).astype(np.int8)
    dd = to_f16(d)[:, None] * sc8.astype(F32)
    # a block below GROUP_MAX_EPS is all zero bytes (value 0 whatever the codes)
    dd = np.where(zero[:, None], F32(0), dd).astype(F32)
    return {"dd": dd, "codes": _rows(codes, nb), "head": (sc8, d, zero)}


def quantize_q6_k(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` -> Q6_K bytes ``(B, 210)``."""
    fit = _fit_q6_k(xs, qw)
    return _pack_q6_k(fit, _codes(fit, 16, 32, xs, False))


def _pack_q6_k(fit: dict, q: np.ndarray) -> np.ndarray:
    sc8, d, zero = fit["head"]
    nb = q.shape[0]
    q = q.reshape(nb, 2, 4, 32).astype(np.uint8)  # [half, quarter, l]
    ql = np.concatenate(
        [
            (q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4),
            (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4),
        ],
        axis=2,
    ).reshape(nb, 128)
    hi = q >> 4
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(
        nb, 64
    )
    out = np.concatenate([ql, qh, sc8.view(np.uint8), f16_bytes(d)], axis=1)
    out[zero] = 0
    return out


def dequantize_q6_k(b: np.ndarray) -> np.ndarray:
    """Q6_K bytes ``(B, 210)`` -> float32 ``(B, 256)``."""
    ql = b[:, :128].reshape(-1, 2, 2, 32)  # [half, which 32 of the 64, l]
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)
    sc = b[:, 192:208].copy().view(np.int8).astype(F32).reshape(-1, 16)
    d = read_f16(b, 208)
    low = np.concatenate([ql & 0xF, ql >> 4], axis=2)  # quarters 0,1,2,3 -> [lo0, lo1, hi0, hi1]
    low = low[:, :, [0, 1, 2, 3]]
    hbits = (qh >> (np.arange(4, dtype=np.uint8) * 2)[None, None, :, None]) & 3
    q = (low.astype(np.int32) | (hbits.astype(np.int32) << 4)) - 32  # (B, 2, 4, 32)
    dl = (d[:, None] * sc).reshape(-1, 2, 4, 2, 1)
    return (dl * q.reshape(-1, 2, 4, 2, 16).astype(F32)).reshape(-1, 256)
