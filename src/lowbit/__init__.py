"""lowbit: the number formats of deep learning, exact and visible.

``import lowbit`` loads numpy only; ml_dtypes (a core dependency, whose import costs 0.7-0.8 s
of CPU in version 0.7), torch, transformers and matplotlib are imported by the parts that
need them.
"""

from __future__ import annotations

from lowbit._version import __version__
from lowbit.enums import Inf, NaN, Rounding
from lowbit.errors import CodeRangeError, LowbitError, NaNPolicyError, UnknownFormatError
from lowbit.formats.base import Format
from lowbit.formats.catalog import ALIASES, FORMATS, format, p3109
from lowbit.formats.floats import FloatFormat
from lowbit.formats.ints import IntFormat
from lowbit.formats.valueset import ValueSetFormat

# Parts beyond the formats load on first use, so ``import lowbit`` stays light.
_LAZY = {
    "quantize": "lowbit.quant.tensor",
    "quantize_dynamic": "lowbit.quant.tensor",
    "dequantize": "lowbit.quant.tensor",
    "QuantizedTensor": "lowbit.quant.tensor",
    "Scheme": "lowbit.quant.scheme",
    "error": "lowbit.quant.metrics",
    "pack": "lowbit.codecs.packing",
    "unpack": "lowbit.codecs.packing",
    "plan": "lowbit.planning.estimate",
    "load": "lowbit.checkpoints",
    "load_model": "lowbit.models.build",
    "open_checkpoint": "lowbit.checkpoints",
    "quantize_model": "lowbit.jobs.quantize",
    "PrecisionPlan": "lowbit.plans.plan",
    "GPTQ": "lowbit.methods.gptq",
    "AWQ": "lowbit.methods.awq",
    "SmoothQuant": "lowbit.methods.smoothquant",
    "Calibration": "lowbit.calibration.data",
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
