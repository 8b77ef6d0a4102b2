"""Apple MLX's quantized weights, byte for byte as ``mx.quantize`` makes them on the CPU.

MLX stores a quantized ``(rows, n)`` matrix as ``(rows, n * bits / 32)`` uint32 words: each
row is one little-endian bit stream, code ``i`` in stream bits ``[i*bits, (i+1)*bits)``, least
significant bit first (``lowbit.codecs.packing``'s order; 3-, 5- and 6-bit codes straddle
words). Codes ``[1, 2, 3, 4, 5, 6, 7, 8]`` at 4 bits make the word ``0x87654321``.

Modes (``mx.quantize(w, group_size, bits, mode)``, mlx 0.32):

* ``affine``: bits 1, 2, 3, 4, 5, 6, 8 (1 bit: the group's minimum and maximum); groups of 32, 64 or 128 along a row; ``w ~ scale * q +
  bias`` with ``scale`` and ``bias`` in the weight's dtype. The CPU kernel works in float32:
  ``scale = max((max - min) / (2**bits - 1), 1e-7)``; the *edge* is the group's end of larger
  magnitude (``min`` when ``|min| > |max|``, else ``max``, the scale then negated, so scales
  are often negative); ``q0 = rint(edge / scale)`` and, when ``q0 != 0``, the scale becomes
  ``edge / q0`` and the bias ``edge`` (the edge is then exact); codes are
  ``clip(rint((w - bias) / scale), 0, 2**bits - 1)`` with the float32 scale, and only then
  are scale and bias rounded to the weight's dtype. Apple-GPU files differ (MLX's Metal
  kernel rounds half away from zero, and starts its running maximum at 0): lowbit follows
  the CPU, which is what this machine can check.
* ``mxfp4`` (groups of 32, E2M1 codes, E8M0 scales), ``mxfp8`` (groups of 32, E4M3 codes,
  E8M0 scales), ``nvfp4`` (groups of 16, E2M1 codes, E4M3 scales): MLX's CPU path is a chain
  of array operations: ``s = amax / 6`` (or ``/ 448``) rounded to the weight's dtype; MX
  scales are ``2**ceil(log2 s)`` (:func:`mlx_e8m0_exponent`; neither OCP's floor nor
  compressed-tensors' rule), NVFP4's are ``s`` rounded to E4M3. E2M1 codes are the nearest
  of the 16-entry table with ties to the *first* entry (toward zero; ``-0`` never appears),
  E4M3 codes are round-to-nearest-even, saturating at 448.

Each function takes and returns numpy arrays; float16, bfloat16 (ml_dtypes) and float32
weights keep their dtype in scales and biases, as MLX's do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit._arrays import ml_dtype
from lowbit.codecs.packing import pack, unpack
from lowbit.errors import LowbitError

__all__ = [
    "AFFINE_BITS",
    "AFFINE_GROUP_SIZES",
    "MODES",
    "affine_codes",
    "affine_params",
    "dequantize",
    "mlx_e8m0_exponent",
    "mode_defaults",
    "pack_rows",
    "quantize",
    "unpack_rows",
]

AFFINE_BITS = (1, 2, 3, 4, 5, 6, 8)
AFFINE_GROUP_SIZES = (32, 64, 128)
#: mode -> (group size, bits) that MLX requires (affine: its defaults)
MODES = {"affine": (64, 4), "mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}

_E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)


def mode_defaults(mode: str) -> tuple[int, int]:
    """``(group_size, bits)`` of an MLX mode (affine: mlx_lm.convert's 64 and 4).

    Raises:
        LowbitError: an unknown mode.
    """
    if mode not in MODES:
        raise LowbitError(f"unknown MLX quantization mode {mode!r}; allowed: {', '.join(MODES)}")
    return MODES[mode]


def check_params(mode: str, group_size: int, bits: int) -> None:
    """Raise one LowbitError line unless MLX can hold ``mode`` at ``group_size`` and ``bits``."""
    gs, b = mode_defaults(mode)
    if mode == "affine":
        if bits not in AFFINE_BITS:
            raise LowbitError(
                f"MLX affine quantization holds bits {', '.join(map(str, AFFINE_BITS))}; "
                f"got {bits!r}"
            )
        if group_size not in AFFINE_GROUP_SIZES:
            raise LowbitError(
                f"MLX affine quantization takes groups of "
                f"{', '.join(map(str, AFFINE_GROUP_SIZES))}; got {group_size!r}"
            )
    elif (group_size, bits) != (gs, b):
        raise LowbitError(
            f"MLX {mode} is {b} bits in groups of {gs}; got bits={bits!r}, "
            f"group_size={group_size!r}"
        )


def pack_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack ``(..., n)`` unsigned codes into MLX's ``(..., n * bits / 32)`` uint32 words."""
    codes = np.asarray(codes)
    n = codes.shape[-1]
    if (n * bits) % 32:
        raise LowbitError(f"{n} codes of {bits} bits do not fill whole 32-bit words")
    words = pack(codes, bits).view("<u4")
    return words.reshape(*codes.shape[:-1], n * bits // 32).astype(np.uint32, copy=False)


def unpack_rows(words: np.ndarray, bits: int) -> np.ndarray:
    """The ``(..., words * 32 / bits)`` uint8 codes of MLX's packed rows."""
    words = np.ascontiguousarray(words, dtype="<u4")
    n = words.shape[-1] * 32 // bits
    flat = unpack(words.view(np.uint8).reshape(-1), bits, int(np.prod(words.shape[:-1])) * n)
    return flat.astype(np.uint8, copy=False).reshape(*words.shape[:-1], n)


def _weight(w: Any, group_size: int) -> np.ndarray:
    w = np.asarray(w)
    if w.dtype not in (np.float32, np.float16, ml_dtype("bfloat16")):
        raise LowbitError(f"MLX quantizes float32, float16 or bfloat16 weights, not {w.dtype}")
    if w.ndim < 2:
        raise LowbitError(f"MLX quantizes matrices (2 or more dimensions); got shape {w.shape}")
    if w.shape[-1] % group_size:
        raise LowbitError(
            f"a row of {w.shape[-1]} values is not a whole number of groups of {group_size}"
        )
    if not np.all(np.isfinite(w)):
        raise LowbitError("cannot quantize a weight with NaN or infinite values to MLX")
    return w


def quantize(
    w: Any, *, mode: str = "affine", group_size: int | None = None, bits: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Quantize ``w`` (float32/float16/bfloat16, ``(..., n)``) as ``mx.quantize`` on the CPU.

    Returns:
        ``(words, scales, biases)``: uint32 words ``(..., n*bits/32)``; scales ``(...,
        n/group_size)`` in ``w``'s dtype (affine) or uint8 codes (E8M0 for mxfp4/mxfp8, E4M3
        for nvfp4); biases in ``w``'s dtype (affine) or None.

    Raises:
        LowbitError: an unknown mode, bits or group size MLX does not hold, a row that is not
            whole groups, a non-float dtype or non-finite values.
    """
    gs0, b0 = mode_defaults(mode)
    gs = gs0 if group_size is None else int(group_size)
    b = b0 if bits is None else int(bits)
    check_params(mode, gs, b)
    w = _weight(w, gs)
    if mode == "affine":
        return _affine_quantize(w, gs, b)
    words, scales = _fp_quantize(w, mode, gs)
    return words, scales, None


def affine_params(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """MLX's float32 scale and bias of each group ``x [..., group]`` (float32 values of the
    weight's dtype): the CPU kernel's edge rule (1 bit: the group's ends)."""
    w_max = x.max(axis=-1)
    w_min = x.min(axis=-1)
    if bits == 1:  # two levels, the group's ends: bit 0 -> min, bit 1 -> max
        return np.maximum(w_max - w_min, np.float32(1e-7)).astype(np.float32), w_min
    n_bins = np.float32(2**bits - 1)
    use_min = np.abs(w_min) > np.abs(w_max)
    scale = np.maximum((w_max - w_min) / n_bins, np.float32(1e-7))
    scale = np.where(use_min, scale, -scale)
    edge = np.where(use_min, w_min, w_max)
    q0 = np.rint(edge / scale)
    nz = q0 != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(nz, edge / q0, scale).astype(np.float32)
    return scale, np.where(nz, edge, np.float32(0)).astype(np.float32)


def affine_codes(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, bits: int) -> np.ndarray:
    """MLX's codes ``clip(rint((x - bias) / scale), 0, 2**bits - 1)`` in float32, uint8;
    ``scale`` and ``bias`` broadcast against ``x``."""
    q = np.rint((x - bias) / scale)
    return np.clip(q, 0, 2**bits - 1).astype(np.uint8)


def _affine_quantize(w: np.ndarray, gs: int, bits: int) -> tuple[np.ndarray, ...]:
    shape = w.shape
    x = w.astype(np.float32).reshape(-1, shape[-1] // gs, gs)
    scale, bias = affine_params(x, bits)
    codes = affine_codes(x, scale[..., None], bias[..., None], bits).reshape(shape)
    sshape = (*shape[:-1], shape[-1] // gs)
    return (
        pack_rows(codes, bits),
        scale.astype(w.dtype).reshape(sshape),
        bias.astype(w.dtype).reshape(sshape),
    )


def mlx_e8m0_exponent(scale: np.ndarray) -> np.ndarray:
    """MLX's E8M0 exponent of block scales ``s = amax / element max`` (``s`` already rounded
    to the weight's dtype): ``ceil(log2 s)`` in float32, 0 for ``s == 0``, as int32.

    OCP MX v1.0 floors ``log2 amax`` and subtracts the element's emax, so a block's largest
    value can round past the element maximum; MLX (0.32 on the CPU) takes the smallest power
    of two that keeps ``amax / 2**e`` within it (torchao's and cuBLAS's ``RCEIL``), computed
    from the scale *after* it was rounded to the weight's dtype."""
    s = np.asarray(scale).astype(np.float32)
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(s))
    return np.where(s == 0, np.float32(0), e).astype(np.int32)


def _to_e4m3(x: np.ndarray) -> np.ndarray:
    """MLX's float -> E4M3 code: round to nearest even, |x| >= 464 saturates to 448."""
    f = np.asarray(x, dtype=np.float32)
    sat = np.abs(f) >= np.float32(464.0)
    f = np.where(sat, np.copysign(np.float32(448.0), f), f)
    return f.astype(ml_dtype("float8_e4m3fn")).view(np.uint8)


def _from_e4m3(codes: np.ndarray) -> np.ndarray:
    return codes.astype(np.uint8).view(ml_dtype("float8_e4m3fn")).astype(np.float32)


def _nearest_e2m1(v: np.ndarray) -> np.ndarray:
    """argmin over MLX's E2M1 table of ``|v - table|`` in ``v``'s dtype, first index on ties."""
    lut = _E2M1.astype(v.dtype)
    best = np.zeros(v.shape, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        best_d = np.abs(v - lut[0])
        for i in range(1, 16):
            d = np.abs(v - lut[i])
            better = d < best_d  # NaN never wins, as in MLX's argmin
            best = np.where(better, np.uint8(i), best)
            best_d = np.where(better, d, best_d)
    return best


def _fp_quantize(w: np.ndarray, mode: str, gs: int) -> tuple[np.ndarray, np.ndarray]:
    dt = w.dtype
    shape = w.shape
    a = w.reshape(-1, gs)
    maxval = dt.type(6.0 if mode != "mxfp8" else 448.0)
    s = (np.abs(a).max(axis=-1, keepdims=True) / maxval).astype(dt)
    with np.errstate(divide="ignore", invalid="ignore"):
        if mode == "nvfp4":
            scodes = _to_e4m3(s)
            v = (a / _from_e4m3(scodes).astype(dt)).astype(dt).astype(np.float32)
        else:
            e = mlx_e8m0_exponent(s)
            p = np.ldexp(np.float32(1.0), e).astype(dt)
            v = (a / p).astype(dt)
            scodes = (e + 127).astype(np.uint8)
    if mode == "mxfp8":
        words = _to_e4m3(v).reshape(-1).view("<u4").astype(np.uint32)
        words = words.reshape(*shape[:-1], shape[-1] // 4)
    else:
        words = pack_rows(_nearest_e2m1(v).reshape(shape), 4)
    return words, scodes.reshape(*shape[:-1], shape[-1] // gs)


def dequantize(
    words: Any,
    scales: Any,
    biases: Any = None,
    *,
    mode: str = "affine",
    group_size: int | None = None,
    bits: int | None = None,
    dtype: Any = None,
) -> np.ndarray:
    """Dequantize MLX words as ``mx.dequantize`` does on the CPU.

    Affine: ``q * scale + bias`` in the scales' dtype, each operation rounded to it. FP
    modes: table value times scale in ``dtype`` (default bfloat16, as MLX's).

    Raises:
        LowbitError: bad mode/bits/group size, or words, scales and biases whose shapes do not
            fit each other.
    """
    gs0, b0 = mode_defaults(mode)
    gs = gs0 if group_size is None else int(group_size)
    b = b0 if bits is None else int(bits)
    check_params(mode, gs, b)
    words = np.asarray(words)
    scales = np.asarray(scales)
    if words.dtype != np.uint32:
        raise LowbitError(f"MLX quantized weights are uint32 words, not {words.dtype}")
    if words.ndim < 1 or scales.shape[:-1] != words.shape[:-1]:
        raise LowbitError(
            f"MLX scales of shape {scales.shape} do not fit words of shape {words.shape}"
        )
    n = words.shape[-1] * 32 // b
    if scales.shape[-1] * gs != n:
        raise LowbitError(
            f"MLX scales of shape {scales.shape} do not fit words of shape {words.shape} at "
            f"{b} bits in groups of {gs} ({n} values a row need {n // gs} scales a row)"
        )
    codes = unpack_rows(words, b)
    gshape = (*codes.shape[:-1], n // gs, gs)
    if mode == "affine":
        if biases is None:
            raise LowbitError("MLX affine quantization needs biases beside its scales")
        biases = np.asarray(biases)
        if biases.shape != scales.shape:
            raise LowbitError(
                f"MLX biases of shape {biases.shape} differ from scales of shape {scales.shape}"
            )
        dt = scales.dtype
        if dt not in (np.float32, np.float16, ml_dtype("bfloat16")):
            raise LowbitError(f"MLX affine scales are float32, float16 or bfloat16, not {dt}")
        q = codes.reshape(gshape).astype(dt)
        out = (q * scales[..., None]).astype(dt) + biases[..., None].astype(dt)
        return out.astype(dt).reshape(codes.shape)
    if scales.dtype != np.uint8:
        raise LowbitError(f"MLX {mode} scales are uint8 codes, not {scales.dtype}")
    dt = np.dtype(ml_dtype("bfloat16") if dtype is None else dtype)
    if mode == "mxfp8":
        vals = _from_e4m3(codes).astype(dt)
    else:
        vals = _E2M1[codes].astype(dt)
    if mode == "nvfp4":
        scale = _from_e4m3(scales).astype(dt)
    else:
        scale = np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127).astype(dt)
    out = vals.reshape(gshape) * scale[..., None]
    return out.astype(dt).reshape(codes.shape)
