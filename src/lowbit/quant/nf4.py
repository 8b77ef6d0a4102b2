"""QLoRA NF4 specifics: the NF4 table's derivation and double quantization of block scales.

NF4 (Dettmers et al. 2023, arXiv 2305.14314 §3) stores each value as the nearest of 16
levels (``lowbit.formats.catalog.NF4_TABLE``) of ``x / absmax`` per block of 64 values.

Double quantization (QLoRA §3 "Double Quantization"; bitsandbytes ``quantize_4bit``
with ``compress_statistics=True``): the float32 block absmaxes ``a`` are shifted by
their mean ``offset`` and quantized with bitsandbytes' 8-bit *dynamic* map
(:func:`dynamic_map`) in blocks of 256 scales, each with its own float32 absmax. The
dequantized scale is ``map[code] * absmax2 + offset`` in float32. As in bitsandbytes,
the 4-bit codes are computed with the original absmax; only the stored scale is
compressed (so double quantization changes dequantized values slightly, never codes).
Cost: 8/64 + 32/(64*256) = 0.127 bits per value instead of 32/64 = 0.5.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from lowbit.errors import LowbitError

__all__ = [
    "DQ_BLOCK",
    "NF4_BLOCK",
    "double_dequantize",
    "double_quantize",
    "dynamic_map",
    "nearest_code",
]

#: Values per NF4 block (one absmax scale each): QLoRA's block size, NF4's default group.
NF4_BLOCK = 64
DQ_BLOCK = 256


def _linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """torch.linspace in float32 (CPU): ``start + i*step`` for the first half and
    ``end - (steps-1-i)*step`` for the rest, each rounded once to float32 (torch's
    kernel contracts them to fused multiply-adds), with ``step`` a float32."""
    f = np.float32
    s, e = f(start), f(end)
    step = np.float64(f(f(e - s) / f(steps - 1)))
    i = np.arange(steps, dtype=np.float64)
    half = steps // 2
    # the products and sums are exact in float64 here (24-bit step times a small integer)
    lo = np.float64(s) + step * i[:half]
    hi = np.float64(e) - step * (steps - 1 - i[half:])
    return np.concatenate([lo, hi]).astype(np.float32)


@cache
def dynamic_map() -> np.ndarray:
    """bitsandbytes' signed 8-bit dynamic quantization map (256 sorted float32 values).

    Dettmers 2015 (arXiv 1511.04561) "dynamic tree" type as bitsandbytes builds it
    (``create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)``): for
    i = 0..6, the midpoints of ``linspace(0.1, 1, 2**i + 1)`` scaled by ``10**(i-6)``,
    with both signs, plus 0 and 1. Arithmetic in float32 as torch does it.
    """
    data: list[np.ndarray] = []
    for i in range(7):
        b = _linspace_f32(0.1, 1.0, 2**i + 1)
        means = ((b[:-1] + b[1:]).astype(np.float32) / np.float32(2.0)).astype(np.float32)
        factor = np.float32(10.0 ** (-(7 - 1) + i))
        v = (factor * means).astype(np.float32)
        data.append(v)
        data.append(-v)
    data.append(np.array([0.0, 1.0], dtype=np.float32))
    out = np.sort(np.concatenate(data)).astype(np.float32)
    assert out.size == 256
    out.setflags(write=False)
    return out


def nearest_code(t: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Index of the nearest table entry (ties to the lower index, as argmin does)."""
    t64 = np.asarray(t, dtype=np.float64)
    tab = table.astype(np.float64)
    hi = np.clip(np.searchsorted(tab, t64, side="left"), 1, tab.size - 1)
    lo = hi - 1
    up = (tab[hi] - t64) < (t64 - tab[lo])
    return np.where(up, hi, lo).astype(np.uint8)


def double_quantize(absmax: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """Compress float32 block scales: (8-bit codes, float32 absmax per 256, float32 offset).

    Raises:
        LowbitError: for non-finite scales (NaN propagation and double quantization do
            not mix).
    """
    a = np.asarray(absmax, dtype=np.float32).reshape(-1)
    if not np.isfinite(a).all():
        raise LowbitError("double quantization needs finite block scales (no NaN/inf input)")
    offset = np.float32(np.mean(a, dtype=np.float64))
    c = (a - offset).astype(np.float32)
    n = c.size
    nb = (n + DQ_BLOCK - 1) // DQ_BLOCK
    padded = np.zeros(nb * DQ_BLOCK, dtype=np.float32)
    padded[:n] = c
    blocks = padded.reshape(nb, DQ_BLOCK)
    amax2 = np.max(np.abs(blocks), axis=1).astype(np.float32)
    # last block: only its real entries count (the zero padding cannot raise the max)
    safe = np.where(amax2 > 0, amax2, np.float32(1.0))
    normed = np.clip(blocks.astype(np.float64) / safe[:, None], -1.0, 1.0)
    codes = nearest_code(normed, dynamic_map()).reshape(-1)[:n]
    return codes, amax2, offset


def double_dequantize(codes: np.ndarray, amax2: np.ndarray, offset: np.float32) -> np.ndarray:
    """Float32 block scales from double-quantized storage: ``map[code] * absmax2 + offset``."""
    c = np.asarray(codes, dtype=np.uint8).reshape(-1)
    n = c.size
    nb = (n + DQ_BLOCK - 1) // DQ_BLOCK
    a2 = np.asarray(amax2, dtype=np.float32).reshape(-1)
    if a2.size != nb:
        raise LowbitError(
            f"double-quantized scales: {n} codes need {nb} second-level scales, got {a2.size}"
        )
    vals = dynamic_map()[c]
    per = np.repeat(a2, DQ_BLOCK)[:n]
    return ((vals * per).astype(np.float32) + np.float32(offset)).astype(np.float32)
