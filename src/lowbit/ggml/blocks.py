"""Quantize float rows to any GGML block type llama.cpp writes, and decode them: the one entry point.

:func:`quantize` gives the bytes ``ggml_quantize_chunk(type, x, ..., imatrix)`` writes (llama.cpp
at the commit of ``tests/fixtures/llamacpp``; byte-identical there for every type, with and
without an importance vector), :func:`dequantize` reads them back as ggml's
``dequantize_row_*`` does. The algorithms and layouts are documented in the modules that
implement them: :mod:`lowbit.ggml.legacy_blocks` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0),
:mod:`lowbit.ggml.kquants` (Q2_K..Q6_K), :mod:`lowbit.ggml.iquants` (IQ4_NL, IQ4_XS),
:mod:`lowbit.ggml.iq_lattice` (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), :mod:`lowbit.ggml.iq1`
(IQ1_S, IQ1_M),
:mod:`lowbit.ggml.ternary` (TQ1_0, TQ2_0) and :mod:`lowbit.ggml.fp4` (MXFP4, NVFP4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit._arrays import _is_ml_float
from lowbit._parallel import map_chunks, threads
from lowbit.errors import LowbitError
from lowbit.ggml import _numba as _ggml_numba
from lowbit.ggml import fp4, iq1, iq_lattice, iquants, kquants, legacy_blocks, ternary

__all__ = [
    "TYPES",
    "GgmlType",
    "check_scales",
    "dequantize",
    "ggml_type",
    "nbytes",
    "quantize",
    "row_bytes",
]


@dataclass(frozen=True)
class GgmlType:
    """One GGML block type: its name, ggml type number, values and bytes per block."""

    name: str
    number: int
    block: int
    size: int
    uses_imatrix: bool
    """Whether llama.cpp's quantizer reads an importance vector for this type."""


_TABLE = [
    ("Q4_0", 2, 32, 18, True),
    ("Q4_1", 3, 32, 20, True),
    ("Q5_0", 6, 32, 22, True),
    ("Q5_1", 7, 32, 24, True),
    ("Q8_0", 8, 32, 34, False),
    ("Q2_K", 10, 256, 84, True),
    ("Q3_K", 11, 256, 110, True),
    ("Q4_K", 12, 256, 144, True),
    ("Q5_K", 13, 256, 176, True),
    ("Q6_K", 14, 256, 210, True),
    ("IQ2_XXS", 16, 256, 66, True),
    ("IQ2_XS", 17, 256, 74, True),
    ("IQ3_XXS", 18, 256, 98, True),
    ("IQ1_S", 19, 256, 50, True),
    ("IQ3_S", 21, 256, 110, True),
    ("IQ2_S", 22, 256, 82, True),
    ("IQ1_M", 29, 256, 56, True),
    ("IQ4_NL", 20, 32, 18, True),
    ("IQ4_XS", 23, 256, 136, True),
    ("TQ1_0", 34, 256, 54, False),
    ("TQ2_0", 35, 256, 66, False),
    ("MXFP4", 39, 32, 17, False),
    ("NVFP4", 40, 64, 36, False),
]
TYPES: dict[str, GgmlType] = {row[0]: GgmlType(*row) for row in _TABLE}
"""The block types this package writes and reads, by llama.cpp's name."""

_BY_NUMBER = {t.number: t for t in TYPES.values()}

NEEDS_IMATRIX = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S"})
"""Types llama.cpp quantizes only with an importance vector (``ggml_quantize_chunk`` asserts)."""

_ENCODERS = {
    "Q2_K": kquants.quantize_q2_k,
    "Q3_K": kquants.quantize_q3_k,
    "Q4_K": kquants.quantize_q4_k,
    "Q5_K": kquants.quantize_q5_k,
    "Q6_K": kquants.quantize_q6_k,
    "IQ2_XXS": iq_lattice.quantize_iq2_xxs,
    "IQ2_XS": iq_lattice.quantize_iq2_xs,
    "IQ2_S": iq_lattice.quantize_iq2_s,
    "IQ3_XXS": iq_lattice.quantize_iq3_xxs,
    "IQ3_S": iq_lattice.quantize_iq3_s,
    "IQ1_S": iq1.quantize_iq1_s,
    "IQ1_M": iq1.quantize_iq1_m,
    "IQ4_NL": iquants.quantize_iq4_nl,
    "IQ4_XS": iquants.quantize_iq4_xs,
    "TQ1_0": lambda xs, qw: ternary.quantize_tq1_0(xs),
    "TQ2_0": lambda xs, qw: ternary.quantize_tq2_0(xs),
    "MXFP4": lambda xs, qw: fp4.quantize_mxfp4(xs),
    "NVFP4": lambda xs, qw: fp4.quantize_nvfp4(xs),
}
_DECODERS = {
    "Q2_K": kquants.dequantize_q2_k,
    "Q3_K": kquants.dequantize_q3_k,
    "Q4_K": kquants.dequantize_q4_k,
    "Q5_K": kquants.dequantize_q5_k,
    "Q6_K": kquants.dequantize_q6_k,
    "IQ2_XXS": iq_lattice.dequantize_iq2_xxs,
    "IQ2_XS": iq_lattice.dequantize_iq2_xs,
    "IQ2_S": iq_lattice.dequantize_iq2_s,
    "IQ3_XXS": iq_lattice.dequantize_iq3_xxs,
    "IQ3_S": iq_lattice.dequantize_iq3_s,
    "IQ1_S": iq1.dequantize_iq1_s,
    "IQ1_M": iq1.dequantize_iq1_m,
    "IQ4_NL": iquants.dequantize_iq4_nl,
    "IQ4_XS": iquants.dequantize_iq4_xs,
    "TQ1_0": ternary.dequantize_tq1_0,
    "TQ2_0": ternary.dequantize_tq2_0,
    "MXFP4": fp4.dequantize_mxfp4,
    "NVFP4": fp4.dequantize_nvfp4,
}

_CHUNK = 1 << 20  # values per step: bounds the searches' temporaries (tens of MB)

# byte offsets of each block's float16 scales (ggml-common.h), checked as llama-quantize's
# ggml_validate_row_data checks them: a scale that overflowed float16 is refused
_F16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
    "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,),
    "IQ4_XS": (0,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,),
    "IQ3_S": (0,), "IQ1_S": (0,), "IQ1_M": (), "TQ1_0": (52,), "TQ2_0": (64,), "MXFP4": (), "NVFP4": (),
}  # fmt: skip


def _validate(blocks_: np.ndarray, t: GgmlType, part: np.ndarray | None) -> None:
    """Refuse blocks whose float16 scale is infinite (llama.cpp writes them, then its own
    validation fails) or whose E8M0 exponent is 0xFF (NaN)."""
    b = blocks_.reshape(-1, t.size)
    bad = np.zeros(b.shape[0], dtype=bool)
    for off in _F16_FIELDS[t.name]:
        h = b[:, off].astype(np.uint16) | (b[:, off + 1].astype(np.uint16) << 8)
        bad |= (h & 0x7C00) == 0x7C00
    if t.name == "MXFP4":
        bad |= b[:, 0] == 0xFF
    if t.name == "IQ1_M":  # its float16 d is spread over the top nibbles of four scale words
        sc = b[:, 48:56].astype(np.uint16)
        top = sc[:, 1::2] >> 4  # the high byte of each little-endian word, its top nibble
        h = top[:, 0] | (top[:, 1] << 4) | (top[:, 2] << 8) | (top[:, 3] << 12)
        bad |= (h & 0x7C00) == 0x7C00
    if bad.any():
        amax = float(np.abs(part).max()) if part is not None and part.size else float("nan")
        raise LowbitError(
            f"{t.name} block scale overflows its format (largest |value| {amax:.6g}); "
            "scale the tensor down or keep it in F32"
        )


def check_scales(data: np.ndarray, qtype: Any, values: np.ndarray | None = None) -> None:
    """Refuse block bytes whose float16 scale overflowed (as llama.cpp's row validation does).

    Raises:
        LowbitError: an infinite float16 scale (or an MXFP4 NaN exponent) in ``data``.
    """
    _validate(np.asarray(data), ggml_type(qtype), values)


def ggml_type(qtype: Any) -> GgmlType:
    """Look up a block type by name (any case), ggml type number or ``gguf.GGMLQuantizationType``.

    Raises:
        LowbitError: a type this package does not implement.
    """
    if isinstance(qtype, GgmlType):
        return qtype
    if isinstance(qtype, (int, np.integer)) and not isinstance(qtype, bool):
        if int(qtype) in _BY_NUMBER:
            return _BY_NUMBER[int(qtype)]
    else:
        name = str(getattr(qtype, "name", qtype)).upper()
        if name in TYPES:
            return TYPES[name]
    raise LowbitError(f"unknown GGML block type {qtype!r}; lowbit writes {list(TYPES)}")


def row_bytes(qtype: Any, n: int) -> int:
    """Bytes of one row of ``n`` values in ``qtype`` (``n`` a multiple of the block)."""
    t = ggml_type(qtype)
    if n % t.block:
        raise LowbitError(
            f"{t.name} stores rows in blocks of {t.block} values; a row of {n} is not a multiple"
        )
    return n // t.block * t.size


def nbytes(shape: tuple[int, ...], qtype: Any) -> int:
    """Bytes a tensor of ``shape`` (rows along the last axis) takes in ``qtype``."""
    if not shape:
        raise LowbitError("a GGML block tensor needs at least one axis")
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    return rows * row_bytes(qtype, int(shape[-1]))


def _check_input(x: Any, t: GgmlType) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" and not _is_ml_float(arr.dtype):
        raise LowbitError(f"{t.name} quantizes real numbers, got an array of dtype {arr.dtype}")
    if arr.ndim == 0:
        raise LowbitError(f"{t.name} quantizes rows; got a scalar")
    row_bytes(t, int(arr.shape[-1]))
    return arr  # cast to float32 and checked for NaN chunk by chunk (_finite_rows)


def _finite_rows(part: np.ndarray, t: GgmlType) -> np.ndarray:
    """A chunk of rows as contiguous float32, refused if it holds NaN or infinity: casting and
    checking per chunk keeps a bfloat16 embedding of 128,256 x 4,096 from becoming a 2.1 GB
    float32 copy (plus a 0.5 GB mask) before the first block is written."""
    part = np.ascontiguousarray(part, dtype=np.float32)
    if not np.isfinite(part).all():
        raise LowbitError(f"{t.name} cannot hold NaN or infinity; the input has some")
    return part


def _check_imatrix(imatrix: Any, n: int, t: GgmlType) -> np.ndarray:
    im = np.asarray(imatrix)
    if im.dtype.kind not in "fiu":
        raise LowbitError(f"the importance vector must be real numbers, got dtype {im.dtype}")
    im = np.ascontiguousarray(im, dtype=np.float32).reshape(-1)
    if im.size != n:
        raise LowbitError(
            f"the importance vector has {im.size} values; {t.name} rows here have {n} columns"
        )
    if not np.isfinite(im).all() or (im < 0).any():
        raise LowbitError(
            f"the importance vector for {t.name} must be finite and non-negative "
            "(it has NaN, infinite or negative values)"
        )
    return im


def quantize(x: Any, qtype: Any, imatrix: Any = None) -> np.ndarray:
    """Quantize rows (the last axis) to GGML blocks, byte for byte as llama.cpp.

    Args:
        x: real array; its last axis (a row) must be a multiple of the type's block.
        qtype: a type of :data:`TYPES` (name, number or ``gguf.GGMLQuantizationType``).
        imatrix: optional importance vector, one non-negative weight per column (llama.cpp's
            ``imatrix`` sums divided by counts); ignored by types that do not use one.

    Returns:
        uint8 array of shape ``(*x.shape[:-1], row_bytes(qtype, x.shape[-1]))``.

    Raises:
        LowbitError: unknown type, rows the type cannot hold, NaN/inf values, an importance
        vector of the wrong length or with negative/non-finite weights, or none for a type of
        :data:`NEEDS_IMATRIX`.
    """
    t = ggml_type(qtype)
    arr = _check_input(x, t)
    n = int(arr.shape[-1])
    qw = None
    if imatrix is not None and t.uses_imatrix:
        qw = _check_imatrix(imatrix, n, t)
    elif t.name in NEEDS_IMATRIX:
        raise LowbitError(
            f"{t.name} needs an importance matrix (llama.cpp refuses it without one); "
            "give one (--imatrix) or choose IQ2_S, IQ3_XXS or a K-quant"
        )
    rows = arr.reshape(-1, n)
    out = np.empty((rows.shape[0], row_bytes(t, n)), dtype=np.uint8)
    # chunks of rows are independent: on several threads (lowbit._parallel) where the tensor
    # has enough rows, each at most _CHUNK values (bounding the searches' temporaries)
    step = max(1, min(_CHUNK // n, -(-rows.shape[0] // threads())))

    def chunk(start: int) -> None:
        part = _finite_rows(rows[start : start + step], t)
        xs = part.reshape(-1, t.block)
        w = None if qw is None else np.broadcast_to(qw, part.shape).reshape(-1, t.block)
        if t.name in legacy_blocks.BLOCK_BYTES:
            blocks = legacy_blocks.quantize_legacy(xs, t.name, w, n)
        else:
            blocks = _ENCODERS[t.name](xs, w)
        _validate(blocks, t, part)
        out[start : start + step] = blocks.reshape(part.shape[0], -1)

    with np.errstate(all="ignore"):
        map_chunks(chunk, range(0, rows.shape[0], step))
    return out.reshape(*arr.shape[:-1], out.shape[-1])


def dequantize(data: Any, qtype: Any) -> np.ndarray:
    """Decode GGML block bytes (rows along the last axis) to float32, as ggml does.

    Args:
        data: uint8 array whose last axis is a whole number of blocks.
        qtype: the block type.

    Returns:
        float32 array of shape ``(*data.shape[:-1], values per row)``.

    Raises:
        LowbitError: unknown type, non-uint8 data, or rows that are not whole blocks.
    """
    t = ggml_type(qtype)
    raw = np.asarray(data)
    if raw.dtype != np.uint8:
        raise LowbitError(f"{t.name} data must be uint8 bytes, got dtype {raw.dtype}")
    if raw.ndim == 0 or raw.shape[-1] % t.size:
        raise LowbitError(
            f"{t.name} rows must be whole blocks of {t.size} bytes, got byte shape {raw.shape}"
        )
    blocks = np.ascontiguousarray(raw).reshape(-1, t.size)
    decode = (
        (lambda b: legacy_blocks.dequantize_legacy(b, t.name))
        if t.name in legacy_blocks.BLOCK_BYTES
        else _DECODERS[t.name]
    )
    out = np.empty((blocks.shape[0], t.block), dtype=np.float32)
    # blocks decode independently: in chunks of at most _CHUNK values written into ``out``
    # (a decoder's temporaries stay tens of MB, not several times a 2 GB output head), on
    # several threads where there are enough (lowbit._parallel)
    step = max(1, min(_CHUNK // t.block, -(-blocks.shape[0] // threads())))
    compiled = t.name in _ggml_numba.KQUANT_DECODED

    def chunk(start: int) -> None:
        part, dst = blocks[start : start + step], out[start : start + step]
        if compiled and _ggml_numba.kquant_decode(part, dst, t.name, out.size):
            return
        dst[:] = decode(part).reshape(-1, t.block)

    with np.errstate(all="ignore"):
        map_chunks(chunk, range(0, blocks.shape[0], step))
    return out.reshape(*raw.shape[:-1], raw.shape[-1] // t.size * t.block)
