"""llama.cpp's non-linear 4-bit types IQ4_NL and IQ4_XS: blocks to bytes and back.

Both store indices into one 16-entry table (``kvalues_iq4nl``, ggml-common.h) times a scale,
chosen by ``quantize_row_iq4_nl_impl`` (ggml-quants.c) with ``ntry = 7`` whether or not an
importance vector is given (``ggml_quantize_chunk`` calls ``quantize_iq4_nl`` /
``quantize_iq4_xs``, never the ``_ref`` variants). Layouts (ggml-common.h), little-endian:

- IQ4_NL, 18 bytes per 32 values: float16 ``d``, ``qs[16]`` (byte ``j``: value ``j`` in the low
  nibble, value ``j + 16`` in the high nibble); value ``d * kvalues[q]``.
- IQ4_XS, 136 bytes per 256 values: float16 ``d``, uint16 ``scales_h`` (bits ``2i..2i+1``: the
  high bits of block ``i``'s 6-bit scale), ``scales_l[4]`` (block ``2k`` low nibble, ``2k+1``
  high nibble), ``qs[128]`` (per block of 32 as IQ4_NL's ``qs``); value
  ``d * (scale - 32) * kvalues[q]``.
"""

from __future__ import annotations

import numpy as np

from lowbit.ggml._search import (
    F32,
    GROUP_MAX_EPS,
    _k,
    _use_kernels,
    best_index_int8,
    f16_bytes,
    first_absmax,
    nearest_int,
    seqsum,
)

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])
"""``kvalues_iq4nl``: the 16 levels of IQ4_NL and IQ4_XS, in units of the block scale."""

_NTRY = 7


def _cols(a: np.ndarray, n: int) -> np.ndarray:
    return np.ascontiguousarray(a.reshape(-1, n).T)


def _block_scales(xs: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """The per-32 scale search of ``quantize_row_iq4_nl_impl``: scales (B, k)."""
    nb, sbs = xs.shape
    sigma2 = seqsum(_cols(xs * xs, sbs)) * (F32(2) / F32(sbs))
    xt = _cols(xs, 32)  # (32, G), G = nb * sbs/32
    if qw is None:
        w = xt * xt
    else:
        s2 = np.repeat(sigma2, sbs // 32)[None, :]
        w = _cols(qw, 32) * np.sqrt(s2 + xt * xt)
    if _use_kernels(xs.size):
        vals = KVALUES_IQ4NL.astype(F32)
        d = _k().iq4_block_scales(xs.reshape(-1, 32), np.ascontiguousarray(w.T), vals, _NTRY)
        return d.reshape(nb, -1)
    amax, vmax = first_absmax(xt)
    vals = KVALUES_IQ4NL.astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = -vmax / vals[0]
        ident = F32(1) / d
        codes = best_index_int8(KVALUES_IQ4NL, ident * xt)
        q = vals[codes]
        sumqx = seqsum(w * q * xt)
        sumq2 = seqsum(w * q * q)
        d = np.where(sumq2 > 0, sumqx / sumq2, F32(0)).astype(F32)
        best = d * sumqx
        for itry in range(-_NTRY, _NTRY + 1):
            ident = F32(itry + int(KVALUES_IQ4NL[0])) / vmax
            q = vals[best_index_int8(KVALUES_IQ4NL, ident * xt)]
            sumqx = seqsum(w * q * xt)
            sumq2 = seqsum(w * q * q)
            take = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            d = np.where(take, sumqx / sumq2, d).astype(F32)
            best = np.where(take, d * sumqx, best).astype(F32)
    zero = amax < GROUP_MAX_EPS
    return np.where(zero, F32(0), d).astype(F32).reshape(nb, -1)


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """(B, 32k) codes 0..15 -> (B, 16k): per 32, byte j = value j | value j+16 << 4."""
    c = codes.astype(np.uint8).reshape(codes.shape[0], -1, 2, 16)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(codes.shape[0], -1)


def _unpack_nibbles(b: np.ndarray) -> np.ndarray:
    b = b.reshape(b.shape[0], -1, 1, 16)
    return np.concatenate([b & 0xF, b >> 4], axis=2).reshape(b.shape[0], -1)


def _fit_iq4_nl(xs: np.ndarray, qw: np.ndarray | None) -> dict:
    """IQ4_NL's scale search on blocks ``(B, 32)``: the float32 scale and its inverse."""
    s = _block_scales(xs, qw)[:, 0]
    with np.errstate(divide="ignore"):
        ident = np.where(s != 0, F32(1) / s, F32(0)).astype(F32)
    d16 = s.astype(np.float16).astype(F32)
    return {"inv": ident[:, None], "dq": d16[:, None], "head": (s,)}


def _fit_iq4_xs(xs: np.ndarray, qw: np.ndarray | None) -> dict:
    """IQ4_XS's scale search on super-blocks ``(B, 256)``: the super-block scale ``d``, the
    eight 6-bit block scales and the inverse of each block's float32 ``d * (scale - 32)``."""
    scales = _block_scales(xs, qw)
    _, max_scale = first_absmax(np.ascontiguousarray(scales.T))
    d = max_scale / F32(-32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ident = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
        ls = np.clip(nearest_int(ident[:, None] * scales), -32, 31)
        dl = d[:, None] * ls.astype(F32)
        idl = np.where(dl != 0, F32(1) / dl, F32(0)).astype(F32)
    dq = d.astype(np.float16).astype(F32)[:, None] * ls.astype(F32)
    return {"inv": idl, "dq": dq, "head": (d, ls)}


def round_table(fit: dict, n: int, j: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ4_NL (``n`` 32, one block) / IQ4_XS (groups of 32)'s final rounding of columns
    ``j .. j+c``: the table entry nearest ``x`` times the inverse of the group's *float32*
    scale (llama.cpp rounds with the unrounded scale, so a code can differ from the nearest
    under the stored float16 one). Returns (codes, values ``scale16 * kvalues[q]`` float32)."""
    cols = (j + np.arange(x.shape[1])) // n
    codes = best_index_int8(KVALUES_IQ4NL, fit["inv"][:, cols] * x)
    return codes, fit["dq"][:, cols] * KVALUES_IQ4NL.astype(F32)[codes]


def _pack_iq4_nl(fit: dict, codes: np.ndarray) -> np.ndarray:
    return np.concatenate([f16_bytes(fit["head"][0]), _pack_nibbles(codes)], axis=1)


def _pack_iq4_xs(fit: dict, codes: np.ndarray) -> np.ndarray:
    d, ls = fit["head"]
    nb = codes.shape[0]
    u = (ls + 32).astype(np.uint16)
    low = (u & 0xF).astype(np.uint8).reshape(nb, 4, 2)
    scales_l = low[:, :, 0] | (low[:, :, 1] << 4)
    scales_h = np.zeros(nb, dtype=np.uint16)
    for i in range(8):
        scales_h |= (u[:, i] >> 4) << (2 * i)
    sh = scales_h.astype("<u2").view(np.uint8).reshape(nb, 2)
    return np.concatenate([f16_bytes(d), sh, scales_l, _pack_nibbles(codes)], axis=1)


def quantize_iq4_nl(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Blocks ``(B, 32)`` (and optional weights ``(B, 32)``) -> IQ4_NL bytes ``(B, 18)``."""
    fit = _fit_iq4_nl(xs, qw)
    return _pack_iq4_nl(fit, round_table(fit, 32, 0, xs)[0])


def quantize_iq4_xs(xs: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Super-blocks ``(B, 256)`` (and optional weights) -> IQ4_XS bytes ``(B, 136)``."""
    fit = _fit_iq4_xs(xs, qw)
    return _pack_iq4_xs(fit, round_table(fit, 32, 0, xs)[0])


def dequantize_iq4_nl(b: np.ndarray) -> np.ndarray:
    """IQ4_NL bytes ``(B, 18)`` -> float32 ``(B, 32)``."""
    d = b[:, :2].copy().view(np.float16).astype(F32)
    return d * KVALUES_IQ4NL.astype(F32)[_unpack_nibbles(b[:, 2:])]


def dequantize_iq4_xs(b: np.ndarray) -> np.ndarray:
    """IQ4_XS bytes ``(B, 136)`` -> float32 ``(B, 256)``."""
    nb = b.shape[0]
    d = b[:, :2].copy().view(np.float16).astype(F32)
    sh = b[:, 2:4].copy().view("<u2").astype(np.int32)
    sl = b[:, 4:8]
    low = np.stack([sl & 0xF, sl >> 4], axis=2).reshape(nb, 8).astype(np.int32)
    high = (sh >> (2 * np.arange(8))) & 3
    dl = d * ((low | (high << 4)) - 32).astype(F32)
    q = KVALUES_IQ4NL.astype(F32)[_unpack_nibbles(b[:, 8:])].reshape(nb, 8, 32)
    return (dl[..., None] * q).reshape(nb, 256)
