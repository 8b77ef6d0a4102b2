"""The training-precision lab: train one small model under several recipes and compare.

Every recipe starts from the same initial weights and sees the same batches in the same
order (fixed seeds), so the curves differ only by numerics. This is emulation on the
CPU: the values are those low-precision hardware would compute; the wall times measure
the emulation, not the hardware.

The jobs live in four modules: :mod:`lowbit.training._lab_results` (the settings and the
results), :mod:`lowbit.training._lab_run` (training one recipe), :mod:`lowbit.training._lab_quantized`
(PTQ, QAT conversion, quantized checkpoints) and :mod:`lowbit.training._lab_plot` (the figure);
this module runs them all (:func:`train_lab`) and re-exports their public names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from lowbit.errors import LowbitError
from lowbit.training._lab_plot import plot
from lowbit.training._lab_quantized import (
    load_quantized,
    master_weights,
    plain_model,
    ptq_val,
    quantize_weights,
    save_quantized,
)
from lowbit.training._lab_results import EMULATION_NOTE, LabConfig, LabResult, RecipeResult
from lowbit.training._lab_run import evaluate, new_model, run_recipe
from lowbit.training.data import TextData
from lowbit.training.recipes import Recipe, get_recipe, qat_emulate

__all__ = [
    "EMULATION_NOTE",
    "LabConfig",
    "LabResult",
    "RecipeResult",
    "evaluate",
    "load_quantized",
    "master_weights",
    "new_model",
    "plain_model",
    "plot",
    "ptq_val",
    "quantize_weights",
    "run_recipe",
    "save_quantized",
    "train_lab",
]


def train_lab(
    recipes: Sequence[str | Recipe],
    cfg: LabConfig | None = None,
    *,
    data: TextData | None = None,
    callback: Callable[[str, int, float], None] | None = None,
    save_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
) -> LabResult:
    """Train every recipe and compare them.

    QAT recipes are also converted to real :class:`lowbit.QuantizedTensor` weights and
    evaluated that way (``converted_val``); when ``fp32`` is among the recipes, each QAT
    scheme also gets a PTQ row: the FP32 model's weights quantized after training.

    Args:
        recipes: recipe names (or Recipes), run in order.
        cfg: settings (default :class:`LabConfig`).
        data: the text (default: CPython's documentation).
        callback: progress, as in :func:`run_recipe`.
        save_dir: write each QAT recipe's quantized checkpoint there (``<recipe>.safetensors``).
        overwrite: replace such files that lowbit wrote before (others are refused).

    Returns:
        A :class:`LabResult`.
    """
    cfg = cfg or LabConfig()
    data = data or TextData.from_text()
    recs = [get_recipe(r) if isinstance(r, str) else r for r in recipes]
    if not recs:
        raise LowbitError("no recipes to run")
    names = [r.name for r in recs]
    if len(set(names)) != len(names):
        raise LowbitError(f"a recipe is listed twice: {names}")
    results: list[RecipeResult] = []
    models: dict[str, torch.nn.Module] = {}
    for rec in recs:
        res, model = run_recipe(rec, cfg, data, callback=callback)
        if rec.qat is not None and res.diverged_at is None:
            qts = quantize_weights(model, rec)
            conv = plain_model(model, cfg, qts)
            if rec.qat_act:
                qat_emulate(conv, None, act=rec.qat_act)
            res.converted_val = evaluate(
                conv, data.val_batches(cfg.val_batches, cfg.batch_size, cfg.model.ctx)
            )
            res.checkpoint_bytes = sum(q.nbytes for q in qts.values())
            if save_dir is not None:
                Path(save_dir).mkdir(parents=True, exist_ok=True)
                save_quantized(
                    Path(save_dir) / f"{rec.name}.safetensors", conv, qts, overwrite=overwrite
                )
        results.append(res)
        models[rec.name] = model
    ptq: dict[str, float] = {}
    if "fp32" in models:
        for rec in recs:
            if rec.qat is not None:
                ptq["ptq-" + rec.name.removeprefix("qat-")] = ptq_val(
                    models["fp32"], rec, cfg, data
                )
    return LabResult(config=cfg, results=results, ptq=ptq)
