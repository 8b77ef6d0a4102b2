"""lowbit: the number formats of deep learning, exact and visible.

``import lowbit`` loads numpy only; ml_dtypes (a core dependency, whose import costs 0.7-0.8 s
of CPU in version 0.7), torch, transformers and matplotlib are imported by the parts that
need them.

Formats: ``format(name)`` (``FloatFormat``, ``IntFormat``, ``ValueSetFormat``), ``FORMATS``,
``ALIASES``, ``p3109``; ``Rounding``, ``Inf``, ``NaN``; errors ``LowbitError`` and its kinds.

Loaded on first use (the names below import their module when first touched; type checkers
and editors see them through the ``TYPE_CHECKING`` imports of this file):

- ``quantize(x, "int4:g128")``, ``dequantize``, ``quantize_dynamic``, ``QuantizedTensor``,
  ``GgmlTensor`` (llama.cpp block types: ``quantize(x, "q4_k")``), ``Scheme``,
  ``parse_scheme`` (``parse_scheme("nvfp4")``: the text form every command reads), ``error``,
  ``pack``, ``unpack``; ``compare(w, ["int4:g64", "nf4"])`` (``lowbit compare``: schemes
  side by side on the same data, ranked by SQNR);
- ``PrecisionPlan`` (``PrecisionPlan.uniform("int4:g128")``), ``plan`` (memory planning);
- ``open_checkpoint``, ``load``, ``load_model`` (files, folders or a shipped model name:
  ``"smollm2"``, ``"minilm"``);
- one call per job of the command line (docs/python.md): ``quantize_model`` (``lowbit
  quantize``: any source, method and output; returns a ``QuantizeResult``), ``gguf_mix`` and
  ``gguf_budget`` (its llama.cpp routes), ``mlx_budget`` (its MLX budgets), ``evaluate`` (``lowbit eval``), ``scan``
  (``lowbit sensitivity``) and ``mixed_plan`` (``--budget``), ``sensitivity`` (a scan on an
  open checkpoint), ``imatrix``, ``report``, ``verify``, ``convert_hf_to_gguf``;
- ``Calibration`` (texts, token arrays, datasets, files), ``GPTQ``, ``AWQ``, ``SmoothQuant``;
- ``train_lab`` (``lowbit train-lab``: a small transformer trained in FP32/FP16/BF16/FP8/QAT,
  emulated exactly).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    "parse_scheme": "lowbit.quant.scheme_text",
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
    "GgmlTensor": "lowbit.quant.ggml_tensor",
    "evaluate": "lowbit.jobs.tasks",
    "imatrix": "lowbit.jobs.tasks",
    "report": "lowbit.jobs.tasks",
    "verify": "lowbit.jobs.tasks",
    "convert_hf_to_gguf": "lowbit.jobs.tasks",
    "gguf_mix": "lowbit.jobs.gguf",
    "gguf_budget": "lowbit.jobs.gguf",
    "mlx_budget": "lowbit.jobs.mlx_budget",
    "sensitivity": "lowbit.evaluation.sensitivity",
    "QuantizeResult": "lowbit.jobs.results",
    "mixed_plan": "lowbit.jobs.budget",
    "scan": "lowbit.jobs.budget",
    "compare": "lowbit.jobs.compare",
    "train_lab": "lowbit.training.lab",
}

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors (not run)
    from lowbit.calibration.data import Calibration as Calibration
    from lowbit.checkpoints.opener import load as load
    from lowbit.checkpoints.opener import open_checkpoint as open_checkpoint
    from lowbit.codecs.packing import pack as pack
    from lowbit.codecs.packing import unpack as unpack
    from lowbit.evaluation.sensitivity import sensitivity as sensitivity
    from lowbit.jobs.budget import mixed_plan as mixed_plan
    from lowbit.jobs.budget import scan as scan
    from lowbit.jobs.compare import compare as compare
    from lowbit.jobs.gguf import gguf_budget as gguf_budget
    from lowbit.jobs.gguf import gguf_mix as gguf_mix
    from lowbit.jobs.mlx_budget import mlx_budget as mlx_budget
    from lowbit.jobs.quantize import quantize_model as quantize_model
    from lowbit.jobs.results import QuantizeResult as QuantizeResult
    from lowbit.jobs.tasks import convert_hf_to_gguf as convert_hf_to_gguf
    from lowbit.jobs.tasks import evaluate as evaluate
    from lowbit.jobs.tasks import imatrix as imatrix
    from lowbit.jobs.tasks import report as report
    from lowbit.jobs.tasks import verify as verify
    from lowbit.methods.awq import AWQ as AWQ
    from lowbit.methods.gptq import GPTQ as GPTQ
    from lowbit.methods.smoothquant import SmoothQuant as SmoothQuant
    from lowbit.models.build import load_model as load_model
    from lowbit.planning.estimate import plan as plan
    from lowbit.plans.plan import PrecisionPlan as PrecisionPlan
    from lowbit.quant.ggml_tensor import GgmlTensor as GgmlTensor
    from lowbit.quant.metrics import error as error
    from lowbit.quant.quantized_tensor import QuantizedTensor as QuantizedTensor
    from lowbit.quant.scheme import Scheme as Scheme
    from lowbit.quant.scheme_text import parse_scheme as parse_scheme
    from lowbit.quant.tensor import (
        dequantize as dequantize,
    )
    from lowbit.quant.tensor import (
        quantize as quantize,
    )
    from lowbit.quant.tensor import (
        quantize_dynamic as quantize_dynamic,
    )
    from lowbit.training.lab import train_lab as train_lab


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lowbit' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# written out (not *_LAZY) so that type checkers read it; a test keeps it equal to _LAZY's keys
__all__ = [
    "ALIASES",
    "AWQ",
    "FORMATS",
    "GPTQ",
    "Calibration",
    "CodeRangeError",
    "FloatFormat",
    "Format",
    "GgmlTensor",
    "Inf",
    "IntFormat",
    "LowbitError",
    "NaN",
    "NaNPolicyError",
    "PrecisionPlan",
    "QuantizeResult",
    "QuantizedTensor",
    "Rounding",
    "Scheme",
    "SmoothQuant",
    "UnknownFormatError",
    "ValueSetFormat",
    "__version__",
    "compare",
    "convert_hf_to_gguf",
    "dequantize",
    "error",
    "evaluate",
    "format",
    "gguf_budget",
    "gguf_mix",
    "imatrix",
    "load",
    "load_model",
    "mixed_plan",
    "mlx_budget",
    "open_checkpoint",
    "p3109",
    "pack",
    "parse_scheme",
    "plan",
    "quantize",
    "quantize_dynamic",
    "quantize_model",
    "report",
    "scan",
    "sensitivity",
    "train_lab",
    "unpack",
    "verify",
]
