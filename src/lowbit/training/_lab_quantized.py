"""Post-training quantization and QAT conversion of lab models, and their checkpoints.

:func:`quantize_weights` turns the block linears into :class:`lowbit.QuantizedTensor` in a
recipe's QAT scheme; :func:`ptq_val` measures the PTQ baseline; :func:`save_quantized` and
:func:`load_quantized` write and read them as safetensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lowbit.checkpoints.io.outputs import output_file, writer_metadata
from lowbit.errors import LowbitError
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.tensor import quantize
from lowbit.torch import EmulatedLinear
from lowbit.training._lab_results import LabConfig
from lowbit.training._lab_run import evaluate, new_model
from lowbit.training.data import TextData
from lowbit.training.model import TinyDecoder
from lowbit.training.recipes import Recipe, qat_emulate

__all__ = [
    "load_quantized",
    "master_weights",
    "plain_model",
    "ptq_val",
    "quantize_weights",
    "save_quantized",
]


def master_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Float32 weights of the block linears (``blocks.0.fc1.weight`` ...), emulated or not."""
    out = {}
    for name, mod in model.named_modules():
        if name.startswith("blocks.") and isinstance(mod, (torch.nn.Linear, EmulatedLinear)):
            out[f"{name}.weight"] = mod.weight.detach()
    return out


def quantize_weights(model: torch.nn.Module, recipe: Recipe) -> dict[str, Any]:
    """The block linears' weights as :class:`lowbit.QuantizedTensor` in the recipe's QAT scheme."""
    if recipe.qat is None:
        raise LowbitError(f"recipe {recipe.name} has no QAT format to quantize to")
    return {
        n: quantize(w.numpy(), recipe.qat, **recipe.qat_kwargs)
        for n, w in master_weights(model).items()
    }


def plain_model(
    model: torch.nn.Module, cfg: LabConfig, qtensors: dict[str, Any] | None = None
) -> TinyDecoder:
    """A float32 TinyDecoder with ``model``'s parameters; quantized weights dequantized in."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if qtensors:
        for n, qt in qtensors.items():
            state[n] = torch.from_numpy(np.asarray(qt.dequantize(np.float32)))
    fresh = new_model(cfg)
    fresh.load_state_dict(state)
    return fresh


def ptq_val(model: torch.nn.Module, recipe: Recipe, cfg: LabConfig, data: TextData) -> float:
    """Validation loss of ``model`` (trained in FP32) after quantizing as ``recipe``'s QAT does."""
    q = plain_model(model, cfg, quantize_weights(model, recipe))
    if recipe.qat_act:
        qat_emulate(q, None, act=recipe.qat_act)
    return evaluate(q, data.val_batches(cfg.val_batches, cfg.batch_size, cfg.model.ctx))


def save_quantized(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    qtensors: dict[str, Any],
    *,
    overwrite: bool = False,
) -> int:
    """Write a safetensors checkpoint: quantized block weights + every other parameter in FP32.

    Each quantized tensor ``W`` is stored as ``W.codes``/``W.scale`` (``QuantizedTensor.to_arrays``)
    with its metadata in the ``"lowbit"`` JSON header entry. Written through
    ``lowbit.checkpoints.io.outputs.output_file`` (an existing file is replaced only with
    ``overwrite`` and only when lowbit wrote it; the umask is honoured). Returns the file size in
    bytes.
    """
    from safetensors.numpy import save_file

    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {}
    for name, t in model.state_dict().items():
        if name in qtensors:
            a, m = qtensors[name].to_arrays(prefix=name + ".")
            arrays.update(a)
            meta[name] = m
        elif not name.endswith(".mask"):
            arrays[name] = t.detach().cpu().numpy().astype(np.float32)
    path = Path(path)
    marks = {"lowbit": json.dumps({"version": 1, "quantized": meta}), **writer_metadata()}
    with output_file(path, overwrite=overwrite) as tmp:
        save_file(arrays, str(tmp), metadata=marks)
    return path.stat().st_size


def load_quantized(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read :func:`save_quantized`'s file: name -> QuantizedTensor or float32 numpy array."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        header = json.loads((f.metadata() or {}).get("lowbit", "{}"))
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    out: dict[str, Any] = {}
    quantized = header.get("quantized", {})
    for name, meta in quantized.items():
        out[name] = QuantizedTensor.from_arrays(arrays, meta, prefix=name + ".")
    taken = {k for k in arrays if any(k.startswith(n + ".") for n in quantized)}
    for k, v in arrays.items():
        if k not in taken:
            out[k] = v
    return out
