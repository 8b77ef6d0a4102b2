"""NVFP4's tensor scale: a tensor's own, and one shared by the layers a kernel fuses (q/k/v,
gate/up), as llm-compressor writes them and vLLM requires."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.quant._choose import IN_PLACE_DTYPES, own_tensor_scale
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.scheme import Scheme
from lowbit.quant.tensor import _as_input, quantize

__all__ = ["quantize_shared_tensor_scale", "tensor_scale_of"]


def tensor_scale_of(x: Any, scheme: Scheme) -> np.float32:
    """The float32 tensor scale a two-level scheme (``nvfp4``) gives ``x`` on its own:
    ``448 * 6 / amax(x)`` in compressed-tensors' float32 arithmetic (1.0 for all zeros).

    Raises:
        LowbitError: a scheme without a tensor scale, or a nonzero ``x`` too small for one.
    """
    if not isinstance(scheme, Scheme) or not scheme.tensor_scale:
        raise LowbitError("tensor_scale_of needs a two-level scheme such as nvfp4")
    if isinstance(x, np.ndarray) and x.dtype.name in IN_PLACE_DTYPES:  # read as stored
        return own_tensor_scale(x, scheme)
    return own_tensor_scale(_as_input(x)[0], scheme)


def quantize_shared_tensor_scale(xs: Any, scheme: Scheme, **kw: Any) -> list[QuantizedTensor]:
    """Quantize tensors that one kernel reads as one (q/k/v, gate/up) with one tensor scale:
    the smallest of their own (the largest magnitude wins), as llm-compressor's
    ``update_fused_layer_weight_global_scales`` makes them and vLLM requires.

    Raises:
        LowbitError: a scheme without a tensor scale, or as :func:`quantize`.
    """
    if not isinstance(scheme, Scheme) or not scheme.tensor_scale:
        raise LowbitError("quantize_shared_tensor_scale needs a two-level scheme such as nvfp4")
    g = min(tensor_scale_of(x, scheme) for x in xs)
    return [quantize(x, scheme, tensor_scale=g, **kw) for x in xs]
