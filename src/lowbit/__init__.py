"""lowbit: the number formats of deep learning, exact and visible.

``import lowbit`` loads numpy and ml_dtypes only; torch, transformers and matplotlib are
imported by the parts that need them.
"""

from __future__ import annotations

from lowbit._enums import Inf, NaN, Rounding
from lowbit.base import Format
from lowbit.catalog import ALIASES, FORMATS, format, p3109
from lowbit.errors import CodeRangeError, LowbitError, NaNPolicyError, UnknownFormatError
from lowbit.floatformat import FloatFormat
from lowbit.intformat import IntFormat
from lowbit.valueset import ValueSetFormat

__version__ = "0.1.0"

# Parts beyond the formats load on first use, so ``import lowbit`` stays light.
_LAZY = {
    "quantize": "lowbit.quant",
    "quantize_dynamic": "lowbit.quant",
    "dequantize": "lowbit.quant",
    "QuantizedTensor": "lowbit.quant",
    "Scheme": "lowbit.scheme",
    "error": "lowbit.metrics",
    "pack": "lowbit.packing",
    "unpack": "lowbit.packing",
    "plan": "lowbit.planner",
    "load": "lowbit.checkpoints",
    "load_model": "lowbit.checkpoints",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lowbit' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    *_LAZY,
    "ALIASES",
    "FORMATS",
    "CodeRangeError",
    "FloatFormat",
    "Format",
    "Inf",
    "IntFormat",
    "LowbitError",
    "NaN",
    "NaNPolicyError",
    "Rounding",
    "UnknownFormatError",
    "ValueSetFormat",
    "__version__",
    "format",
    "p3109",
]
