"""llama.cpp's block rounding as a lowbit scheme (``scale_method="ggml"``: q4_0, q5_0, q8_0).

The codes and float16 scales come from :func:`lowbit.ggml.legacy.ggml_block_codes`, the
same arithmetic as ggml's reference quantizers, and are returned as the engine's encoded arrays
(which ``lowbit.quant.tensor`` wraps in a QuantizedTensor) (codes packed as usual, scales float32 holding
float16 values, negative where the block's largest value is positive), so every writer stores
exactly llama.cpp's values.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lowbit.codecs.packing import _pack_unchecked
from lowbit.errors import LowbitError
from lowbit.ggml.legacy import ggml_block_codes
from lowbit.quant.scheme import Scheme

__all__ = ["encode_ggml"]


class _Encoded(NamedTuple):  # the fields of lowbit.quant._engine.Encoded
    codes: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    dq: None
    floored: bool


def encode_ggml(arr: np.ndarray, scheme: Scheme) -> _Encoded:
    """llama.cpp's Q4_0/Q5_0/Q8_0 rounding (``lowbit.ggml.legacy``) as lowbit codes."""

    fmt = scheme.element_format
    if arr.ndim == 0 or arr.shape[-1] % 32:
        raise LowbitError(
            f"{scheme.label} (llama.cpp's block type) needs rows (last axis) that are a multiple "
            f"of 32 values, got shape {arr.shape}; int{fmt.bits}:g32:fp16 pads the last group"
        )
    scale, codes = ggml_block_codes(arr, fmt.bits)
    mask = np.int16((1 << fmt.bits) - 1)
    bits_pattern = (codes.reshape(-1).astype(np.int16) & mask).astype(fmt.code_dtype)
    return _Encoded(_pack_unchecked(bits_pattern, fmt.bits), scale, None, None, False)
