"""Training precision: loss scaling, FP8 scaling, QAT recipes and the train-lab runner.

Needs torch (``pip install 'lowbit[torch]'``) except :mod:`lowbit.training.overflow`.
Everything runs as emulation: values are rounded exactly as the target formats would hold
them (:mod:`lowbit.torch`), the arithmetic runs in float32 on the CPU. Names load lazily,
so ``import lowbit.training.overflow`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "TextData": "data",
    "load_text": "data",
    "EMULATION_NOTE": "lab",
    "LabConfig": "lab",
    "LabResult": "lab",
    "RecipeResult": "lab",
    "evaluate": "lab",
    "load_quantized": "lab",
    "plot": "lab",
    "ptq_val": "lab",
    "quantize_weights": "lab",
    "run_recipe": "lab",
    "save_quantized": "lab",
    "train_lab": "lab",
    "ModelConfig": "model",
    "TinyDecoder": "model",
    "AdamW": "optim",
    "DEFAULT_RECIPES": "recipes",
    "RECIPES": "recipes",
    "Recipe": "recipes",
    "apply_recipe": "recipes",
    "get_recipe": "recipes",
    "DelayedScaling": "scaling",
    "LossScaler": "scaling",
    "current_scaling": "scaling",
    "mx_scaling": "scaling",
    "set_frozen": "scaling",
    "overflow_table": "overflow",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'lowbit.training' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lowbit.training.{mod}"), name)


__all__ = sorted(_LAZY)
