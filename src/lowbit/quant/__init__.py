"""A tensor with scales: schemes, quantize/dequantize, layouts, scales and precision plans.

- :mod:`~lowbit.quant.scheme`: :class:`Scheme`, the one description of how a tensor is
  quantized (format, granularity, scales), with its storage arithmetic.
- :mod:`~lowbit.quant.tensor`: :func:`quantize`, :func:`dequantize`, :func:`quantize_dynamic`
  and :class:`QuantizedTensor`.
- :mod:`~lowbit.quant.layout`, :mod:`~lowbit.quant.scales`: which values share a scale, and how
  each scale is chosen.
- ``_engine``/``_elements``/``_numba``: the chunked engine behind ``quantize`` and its compiled
  path.
- :mod:`~lowbit.quant.nf4`, :mod:`~lowbit.quant.metrics`: QLoRA's NF4 helpers; error metrics.
- :mod:`~lowbit.quant.scheme_text`: the one text form of a scheme (``int4:g128:fp16:asym``)
  and the presets; every command builds its schemes with :func:`parse_scheme`.
- :mod:`~lowbit.quant.components`: which component (embeddings, attention, MLP, ...) a tensor
  name belongs to.
- :mod:`~lowbit.quant.gptq`: GPTQ (calibrated rounding of a weight given its inputs' Hessian)
  with lowbit's own quantizer, for every scheme.
- :mod:`~lowbit.quant.awq`, :mod:`~lowbit.quant.smoothquant`, :mod:`~lowbit.quant.folds`: AWQ's
  and SmoothQuant's scale searches, and the table of exact scale folds per architecture family.
- :mod:`~lowbit.quant.rules`, :mod:`~lowbit.quant.plan`: the one :class:`Rule` type and plan-file
  reader, and :class:`PrecisionPlan` (what each tensor of a model becomes).

Names load on first use, so importing one submodule does not load them all.
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
    "Rule": "lowbit.quant.rules",
    "PrecisionPlan": "lowbit.quant.plan",
    "error": "lowbit.quant.metrics",
    "GPTQ": "lowbit.quant.gptq",
    "gptq_quantize": "lowbit.quant.gptq",
    "AWQ": "lowbit.quant.awq",
    "SmoothQuant": "lowbit.quant.smoothquant",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lowbit.quant' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
