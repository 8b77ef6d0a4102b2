"""Optional compiled kernels (numba) for llama.cpp's Q4_0 / Q4_1 / Q8_0 blocks: bit for bit the numpy path.

``ggml_decode`` (GGUF reading) and ``ggml_encode`` (``lowbit.ggml.legacy``) repeat the numpy
paths' float32 operations element by element; blocks with a non-finite scale go back to numpy,
whose NaN bits depend on operand order. Each returns None/False when numba is missing or off
(``lowbit.codecs._numba`` decides), and the caller takes the numpy path.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from lowbit._parallel import map_chunks
from lowbit.codecs import _numba as _fast


@cache
def _k() -> Any:
    """``lowbit.ggml._kernels``, imported (with numba) on first use."""
    from lowbit.ggml import _kernels  # needs numba, the optional extra

    return _kernels


#: The GGML block types with a compiled decoder, by name: (kernel code, bytes per block).
GGML_DECODED = {"Q4_0": (0, 18), "Q4_1": (1, 20), "Q8_0": (2, 34)}


@cache
def _half_table() -> np.ndarray:
    """The float32 value of every float16 bit pattern (numpy's conversion; the kernels use
    only its finite entries)."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


#: Values of one GGML tensor that pay numba's start alone (importing it, loading the first
#: kernel and its exit: about 0.6 s of CPU, which decoding and encoding SmolLM2-135M's
#: 106 M values saves no more than; 1.7 B values save seconds). Below it the GGML kernels
#: run only where numba is loaded already (lowbit's quantizers load it for their kernels).
GGML_ALONE = 1 << 21


def _ggml_kernels(numel: int) -> bool:
    """Whether a GGML block tensor of ``numel`` values takes the compiled kernels."""
    if _fast.use_kernels(0):  # kernels_always(): any size
        return True
    # its own rule, not the codecs' running count (a tensor's bands ask once each)
    if (
        _fast.enabled()
        and numel >= _fast.MIN_KERNEL_SIZE
        and (numel >= GGML_ALONE or _fast.numba_loaded())
    ):
        _fast.taken()
        return True
    return False


def ggml_decode(blocks: np.ndarray, out: np.ndarray, qtype: str, numel: int) -> bool:
    """Decode ``blocks`` (uint8 rows of one ``qtype`` block each; a band of a tensor of
    ``numel`` values) into ``out`` (float32 rows of 32 values), the bits of
    ``gguf.quants``' decoder; False (``out`` unusable: the caller's numpy path) when numba
    is missing or off, the tensor is small (:data:`GGML_ALONE`), a layout does not fit, or
    a block has a scale or minimum that is not finite."""
    code, size = GGML_DECODED[qtype]
    if not _decodable(blocks, out, size, 32, numel):
        return False
    return bool(_k()._ggml_decode_kernel(blocks, _half_table(), out, code))


def _decodable(blocks: np.ndarray, out: np.ndarray, size: int, values: int, numel: int) -> bool:
    """Whether a decoding kernel takes these arrays: the kernels are on for a tensor of
    ``numel`` values, ``blocks`` are C-contiguous rows of ``size`` bytes and ``out`` their
    C-contiguous float32 rows of ``values``."""
    return (
        _ggml_kernels(numel)
        and blocks.ndim == 2
        and blocks.shape[-1] == size
        and out.shape == (blocks.shape[0], values)
        and out.dtype == np.float32
        and blocks.flags.c_contiguous
        and out.flags.c_contiguous
    )


#: The K-quant types with a compiled decoder (``lowbit.ggml.blocks.dequantize``), by name:
#: (kernel code, bytes per super-block of 256 values).
KQUANT_DECODED = {"Q2_K": (2, 84), "Q3_K": (3, 110), "Q4_K": (4, 144), "Q5_K": (5, 176),
                  "Q6_K": (6, 210)}  # fmt: skip


def kquant_decode(blocks: np.ndarray, out: np.ndarray, qtype: str, numel: int) -> bool:
    """Decode K-quant super-blocks ``blocks`` (uint8 rows of one block each; a chunk of a
    tensor of ``numel`` values) into ``out`` (float32 rows of 256), the bits of
    ``lowbit.ggml.kquants``' numpy decoders; False (``out`` unusable: the caller's numpy
    path) when numba is missing or off, the tensor is small, a layout does not fit, or a
    block's scale or minimum is not finite."""
    code, size = KQUANT_DECODED[qtype]
    if not _decodable(blocks, out, size, 256, numel):
        return False
    return bool(_k()._kquant_decode_kernel(blocks, _half_table(), out, code))


_ENCODE_BAND = 1 << 13  # blocks per thread's band (256 Ki values)


def ggml_encode(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """llama.cpp's Q4_0 (``bits=4``) or Q8_0 (8) rounding of float32 blocks ``x`` (n, 32,
    C-contiguous) by a compiled loop: ``(blocks, d, bad)``, the block bytes but their first
    two (the float16 scale, left for the caller), the unrounded float32 scales and the index
    of the first block holding a NaN or an infinity (-1: none); or None when numba is
    missing or off, ``x`` is small (:data:`GGML_ALONE`), or its layout does not fit (the
    caller's numpy path)."""
    if (
        not _ggml_kernels(x.size)
        or x.dtype != np.float32
        or x.ndim != 2
        or x.shape[1] != 32
        or not x.flags.c_contiguous
    ):
        return None
    n = x.shape[0]
    out = np.empty((n, 2 + (32 if bits == 8 else 16)), dtype=np.uint8)
    d = np.empty(n, dtype=np.float32)
    kernel = _k()._ggml_encode_kernel

    def band(a: int) -> int:
        b = min(a + _ENCODE_BAND, n)
        bad = kernel(x[a:b], x[a:b].view(np.uint32), out[a:b], d[a:b], bits)
        return -1 if bad < 0 else a + bad

    found = [i for i in map_chunks(band, list(range(0, n, _ENCODE_BAND))) if i >= 0]
    return out, d, min(found, default=-1)
