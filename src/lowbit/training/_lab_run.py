"""Training one recipe from the shared initial weights: :func:`run_recipe`, :func:`evaluate`.

Every recipe starts from :func:`new_model`'s weights and sees the same batches in the same
order (fixed seeds), so the curves differ only by numerics.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from lowbit.torch import emulation_stats
from lowbit.training._lab_results import LabConfig, RecipeResult
from lowbit.training.data import TextData
from lowbit.training.model import TinyDecoder
from lowbit.training.optim import AdamW
from lowbit.training.recipes import Recipe, apply_recipe, get_recipe
from lowbit.training.scaling import LossScaler, set_frozen

__all__ = ["evaluate", "new_model", "run_recipe"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean cross-entropy (nats per byte) of ``model`` over ``batches``."""
    was = model.training
    model.eval()
    set_frozen(model, True)
    try:
        total = 0.0
        for x, y in batches:
            logits = model(x)
            total += float(
                torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            )
    finally:
        set_frozen(model, False)
        model.train(was)
    return total / len(batches)


def new_model(cfg: LabConfig) -> TinyDecoder:
    """The shared starting point: a TinyDecoder initialised from ``cfg.seed``."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(cfg.seed)
    try:
        return TinyDecoder(cfg.model)
    finally:
        torch.random.set_rng_state(gen_state)


def run_recipe(
    recipe: Recipe | str,
    cfg: LabConfig,
    data: TextData,
    *,
    callback: Callable[[str, int, float], None] | None = None,
) -> tuple[RecipeResult, TinyDecoder]:
    """Train one recipe from the shared initial weights; return its result and model.

    Args:
        recipe: a Recipe or its name.
        cfg: the lab settings.
        data: the text.
        callback: called as ``callback(recipe_name, step, train_loss)`` after every step
            (progress display).
    """
    rec = get_recipe(recipe) if isinstance(recipe, str) else recipe
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train(rec, cfg, data, callback)
    finally:
        torch.set_num_threads(threads)


def _train(
    rec: Recipe,
    cfg: LabConfig,
    data: TextData,
    callback: Callable[[str, int, float], None] | None,
) -> tuple[RecipeResult, TinyDecoder]:
    model = apply_recipe(new_model(cfg), rec)
    model.train()
    opt = AdamW(model.parameters(), weight_decay=cfg.weight_decay, storage=rec.weights,
                rounding=rec.update_rounding, seed=cfg.seed)  # fmt: skip
    scaler = LossScaler(growth_interval=rec.growth_interval) if rec.loss_scaling else None
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    mcfg = cfg.model
    val = data.val_batches(cfg.val_batches, cfg.batch_size, mcfg.ctx)
    train_curve: list[float] = []
    val_curve: list[tuple[int, float]] = []
    diverged = None
    skipped_at: list[int] = []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        x, y = data.batch(gen, cfg.batch_size, mcfg.ctx)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        (scaler.scale_loss(loss) if scaler else loss).backward()
        apply = True
        if scaler is not None:
            apply = scaler.update(scaler.unscale_(opt.params))
            if not apply:
                skipped_at.append(step + 1)
        if apply:
            if cfg.clip:
                gnorm = float(torch.nn.utils.clip_grad_norm_(opt.params, cfg.clip))
            else:
                gnorm = float(
                    sum(float(p.grad.norm()) ** 2 for p in opt.params if p.grad is not None)
                )
            opt.step(cfg.lr_at(step))
            if not math.isfinite(gnorm) and diverged is None:
                diverged = step  # an inf/NaN gradient went into the weights
        opt.zero_grad()
        lv = float(loss.detach())
        train_curve.append(lv)
        if callback is not None:
            callback(rec.name, step, lv)
        last = step == cfg.steps - 1
        if (step + 1) % cfg.every == 0 or last or diverged is not None:
            val_curve.append((step + 1, evaluate(model, val)))
        if diverged is not None:
            break
    wall = time.perf_counter() - t0
    tail = train_curve[-min(len(train_curve), cfg.every) :]
    stats = emulation_stats(model)
    grads = [stats[r] for r in ("grad_output", "grad_input", "grad_weight") if r in stats]
    seen = sum(g["values"] for g in grads)
    result = RecipeResult(
        name=rec.name,
        summary=rec.summary,
        train_curve=train_curve,
        val_curve=val_curve,
        final_train=float(np.mean(tail)) if diverged is None else math.nan,
        final_val=val_curve[-1][1] if diverged is None else math.nan,
        wall_s=wall,
        steps_done=len(train_curve),
        skipped_steps=scaler.skipped if scaler else 0,
        skipped_at=skipped_at,
        loss_scale=scaler.scale if scaler else None,
        diverged_at=diverged,
        overflow=sum(s["overflow"] for s in stats.values()),
        saturated=sum(s["saturated"] for s in stats.values()),
        grad_underflow=(sum(g["underflow"] for g in grads) / seen) if seen else 0.0,
        updates_lost=(opt.lost / opt.updates) if opt.updates else None,
        stats=stats,
    )
    return result, model
