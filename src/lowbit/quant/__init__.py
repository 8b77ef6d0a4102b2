"""A tensor with scales: schemes, their text form, quantize/dequantize, layouts and scales.

- :mod:`~lowbit.quant.scheme`: :class:`Scheme`, the one description of how a tensor is
  quantized (format, granularity, scales), with its storage arithmetic.
- :mod:`~lowbit.quant.tensor`: :func:`quantize`, :func:`dequantize`, :func:`quantize_dynamic`
  and :class:`QuantizedTensor`.
- :mod:`~lowbit.quant.layout`, :mod:`~lowbit.quant.scales`: which values share a scale, and how
  each scale is chosen.
- ``_engine``/``_elements``/``_numba``: the chunked engine behind ``quantize`` and its compiled
  path; ``_ggml`` adapts llama.cpp's block rounding (:mod:`lowbit.ggml`) to a scheme.
- :mod:`~lowbit.quant.nf4`, :mod:`~lowbit.quant.metrics`: QLoRA's NF4 helpers; error metrics.
- :mod:`~lowbit.quant.scheme_text`: the one text form of a scheme (``int4:g128:fp16:asym``)
  and the presets; every command builds its schemes with :func:`parse_scheme`.

This package's public names also include, for the users who import them from here, the plans'
:class:`Rule` and :class:`PrecisionPlan` (:mod:`lowbit.plans`) and the calibrated methods
:class:`GPTQ`, :class:`AWQ`, :class:`SmoothQuant` (:mod:`lowbit.methods`): names load on first
use, so importing one submodule does not load them all, and nothing in ``quant`` imports those
packages above it.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "quantize": "lowbit.quant.tensor",
    "quantize_dynamic": "lowbit.quant.tensor",
    "dequantize": "lowbit.quant.tensor",
    "QuantizedTensor": "lowbit.quant.tensor",
    "Scheme": "lowbit.quant.scheme",
    "Granularity": "lowbit.quant.scheme",
    "ScaleMethod": "lowbit.quant.scheme",
    "Cast": "lowbit.quant.scheme",
    "parse_scheme": "lowbit.quant.scheme_text",
    "PRESETS": "lowbit.quant.scheme_text",
    "Rule": "lowbit.plans.rules",
    "PrecisionPlan": "lowbit.plans.plan",
    "error": "lowbit.quant.metrics",
    "GPTQ": "lowbit.methods.gptq",
    "gptq_quantize": "lowbit.methods.gptq",
    "AWQ": "lowbit.methods.awq",
    "SmoothQuant": "lowbit.methods.smoothquant",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lowbit.quant' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
