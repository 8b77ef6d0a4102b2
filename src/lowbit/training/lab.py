"""The training-precision lab: train one small model under several recipes and compare.

Every recipe starts from the same initial weights and sees the same batches in the same
order (fixed seeds), so the curves differ only by numerics. This is emulation on the
CPU: the values are those low-precision hardware would compute; the wall times measure
the emulation, not the hardware.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lowbit.errors import LowbitError
from lowbit.torch import EmulatedLinear, emulation_stats
from lowbit.training.data import TextData
from lowbit.training.model import ModelConfig, TinyDecoder
from lowbit.training.optim import AdamW
from lowbit.training.recipes import Recipe, apply_recipe, get_recipe, qat_emulate
from lowbit.training.scaling import LossScaler, set_frozen

EMULATION_NOTE = (
    "Emulation on the CPU: every rounding is exact (lowbit's codecs), but the arithmetic "
    "runs in float32 on the CPU, so wall times measure the emulation, not 16- or 8-bit "
    "hardware."
)


@dataclass(frozen=True, kw_only=True)
class LabConfig:
    """Settings shared by every recipe of a lab run.

    Args:
        steps: optimizer steps per recipe.
        batch_size: sequences per batch.
        lr: peak learning rate (linear warmup, then cosine decay to ``min_lr_ratio * lr``).
        warmup: fraction of the steps spent warming up.
        min_lr_ratio: final learning rate as a fraction of ``lr``.
        weight_decay: AdamW decay on matrices.
        clip: global gradient-norm clipping (0 disables).
        eval_every: steps between validation evaluations (default: steps // 10).
        val_batches: fixed validation batches per evaluation.
        seed: seed of the initial weights and of the batch order.
        threads: torch CPU threads (1 by default: on a busy machine more threads can be
            many times slower, and the float32 sums, hence the curves, depend on it).
        model: the transformer's shape.
    """

    steps: int = 400
    batch_size: int = 16
    lr: float = 2e-3
    warmup: float = 0.05
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    clip: float = 1.0
    eval_every: int | None = None
    val_batches: int = 8
    seed: int = 0
    threads: int = 1
    model: ModelConfig = field(default_factory=ModelConfig)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.val_batches < 1:
            raise LowbitError("steps, batch_size and val_batches must be positive")
        if not self.lr > 0:
            raise LowbitError(f"lr must be positive, got {self.lr}")

    @property
    def every(self) -> int:
        return self.eval_every or max(1, self.steps // 10)

    def lr_at(self, step: int) -> float:
        """Learning rate of step ``step`` (0-based)."""
        warm = max(1, int(self.warmup * self.steps))
        if step < warm:
            return self.lr * (step + 1) / warm
        t = (step - warm) / max(1, self.steps - warm)
        lo = self.min_lr_ratio
        return self.lr * (lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * t)))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["model"] = self.model.to_dict()
        return d


@dataclass
class RecipeResult:
    """What one recipe's run produced (every number the table, plot and JSON show)."""

    name: str
    summary: str
    train_curve: list[float]
    val_curve: list[tuple[int, float]]
    final_train: float
    final_val: float
    wall_s: float
    steps_done: int
    skipped_steps: int = 0
    skipped_at: list[int] = field(default_factory=list)
    loss_scale: float | None = None
    diverged_at: int | None = None
    overflow: int = 0
    saturated: int = 0
    grad_underflow: float = 0.0
    updates_lost: float | None = None
    converted_val: float | None = None
    checkpoint_bytes: int | None = None
    stats: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LabResult:
    """All recipes of one run, plus post-training-quantization rows."""

    config: LabConfig
    results: list[RecipeResult]
    ptq: dict[str, float] = field(default_factory=dict)
    note: str = EMULATION_NOTE

    def by_name(self) -> dict[str, RecipeResult]:
        return {r.name: r for r in self.results}

    def comparisons(self) -> dict[str, Any]:
        """The claims the lab checks, as numbers (relative to fp32's final validation loss)."""
        res = self.by_name()
        out: dict[str, Any] = {}
        ref = res.get("fp32")
        if ref is None or not math.isfinite(ref.final_val):
            return out
        for r in self.results:
            if r.name != "fp32":
                out[f"{r.name}_vs_fp32"] = _rel(r.final_val, ref.final_val)
        for name, val in self.ptq.items():
            out[f"{name}_vs_fp32"] = _rel(val, ref.final_val)
            qat = res.get("qat-" + name.removeprefix("ptq-"))
            if qat is not None:
                out[f"qat_closer_than_{name}"] = abs(qat.final_val - ref.final_val) < abs(
                    val - ref.final_val
                )
                out[f"qat_lower_than_{name}"] = qat.final_val < val
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "note": self.note,
            "config": self.config.to_dict(),
            "recipes": [r.to_dict() for r in self.results],
            "ptq": self.ptq,
            "comparisons": self.comparisons(),
        }

    def table(self) -> tuple[list[str], list[list[Any]]]:
        """(headers, rows) of the summary table."""
        headers = ["recipe", "train loss", "val loss", "vs fp32", "skipped", "overflows",
                   "grad underflow", "wall s", "notes"]  # fmt: skip
        ref = self.by_name().get("fp32")
        rows: list[list[Any]] = []
        for r in self.results:
            notes = []
            if r.diverged_at is not None:
                notes.append(f"diverged at step {r.diverged_at}")
            if r.loss_scale is not None:
                notes.append(f"final loss scale {r.loss_scale:g}")
            if r.updates_lost is not None:
                notes.append(f"{100 * r.updates_lost:.1f}% of updates left the weight unchanged")
            if r.saturated:
                notes.append(f"{r.saturated:,} values saturated")
            if r.converted_val is not None:
                notes.append(f"as QuantizedTensors: val {r.converted_val:.4f}")
            rows.append([
                r.name, r.final_train, r.final_val,
                _pct(r.final_val, ref.final_val) if ref else "-",
                r.skipped_steps, r.overflow, f"{100 * r.grad_underflow:.2f}%",
                round(r.wall_s, 1), "; ".join(notes),
            ])  # fmt: skip
        for name, val in self.ptq.items():
            rows.append([name, "-", val, _pct(val, ref.final_val) if ref else "-", "-", "-",
                         "-", "-", "post-training quantization of the fp32 model"])  # fmt: skip
        return headers, rows


def _rel(a: float, b: float) -> float:
    return (a - b) / b if math.isfinite(a) else math.inf


def _pct(a: float, b: float) -> str:
    if not math.isfinite(a):
        return "failed"
    return f"{100 * (a - b) / b:+.2f}%"


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


# ---- post-training quantization and QAT conversion ----------------------------------------


def master_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Float32 weights of the block linears (``blocks.0.fc1.weight`` ...), emulated or not."""
    out = {}
    for name, mod in model.named_modules():
        if name.startswith("blocks.") and isinstance(mod, (torch.nn.Linear, EmulatedLinear)):
            out[f"{name}.weight"] = mod.weight.detach()
    return out


def quantize_weights(model: torch.nn.Module, recipe: Recipe) -> dict[str, Any]:
    """The block linears' weights as :class:`lowbit.QuantizedTensor` in the recipe's QAT scheme."""
    from lowbit.quant.tensor import quantize

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
    path: str | os.PathLike[str], model: torch.nn.Module, qtensors: dict[str, Any]
) -> int:
    """Write a safetensors checkpoint: quantized block weights + every other parameter in FP32.

    Each quantized tensor ``W`` is stored as ``W.codes``/``W.scale`` (``QuantizedTensor.to_arrays``)
    with its metadata in the ``"lowbit"`` JSON header entry. Written to a temporary name, then
    renamed. Returns the file size in bytes.
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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        save_file(arrays, tmp, metadata={"lowbit": json.dumps({"version": 1, "quantized": meta})})
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path.stat().st_size


def load_quantized(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read :func:`save_quantized`'s file: name -> QuantizedTensor or float32 numpy array."""
    from safetensors import safe_open

    from lowbit.quant.tensor import QuantizedTensor

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


def train_lab(
    recipes: Sequence[str | Recipe],
    cfg: LabConfig | None = None,
    *,
    data: TextData | None = None,
    callback: Callable[[str, int, float], None] | None = None,
    save_dir: str | os.PathLike[str] | None = None,
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
                save_quantized(Path(save_dir) / f"{rec.name}.safetensors", conv, qts)
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


def plot(lab: LabResult, path: str | os.PathLike[str]) -> None:
    """Loss curves of every recipe on one PNG: training loss (smoothed) and validation loss.

    Needs matplotlib (``pip install 'lowbit[plot]'``). Written to a temporary name, then renamed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'lowbit[plot]'") from exc
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 5))
    ref = lab.by_name().get("fp32")
    ref_sm = _ema(np.asarray(ref.train_curve, dtype=np.float64), 0.98) if ref else None
    many = len(lab.results) > 10
    cmap = plt.get_cmap("tab20")
    for i, r in enumerate(lab.results):
        tc = np.asarray(r.train_curve, dtype=np.float64)
        sm = _ema(tc, 0.9)
        style = {"color": cmap(i % 20)} if many else {}
        (line,) = ax1.plot(np.arange(1, len(sm) + 1), sm, label=r.name, lw=1.2, **style)
        if r.diverged_at is not None:
            ax1.axvline(r.diverged_at + 1, color=line.get_color(), ls=":", lw=1)
        steps = [s for s, _ in r.val_curve]
        vals = [v if math.isfinite(v) else np.nan for _, v in r.val_curve]
        ax2.plot(steps, vals, marker="o", ms=3, label=r.name, color=line.get_color())
        if ref_sm is not None and r is not ref:
            n = min(len(tc), len(ref_sm))
            diff = _ema(tc, 0.98)[:n] - ref_sm[:n]
            ax3.plot(np.arange(1, n + 1), diff, label=r.name, color=line.get_color(), lw=1.2)
            skips = [s for s in r.skipped_at if s <= n]
            if skips:  # steps the loss scaler skipped (inf/NaN gradients)
                ax3.plot(skips, diff[np.asarray(skips) - 1], "x", color=line.get_color(), ms=6)
    dashes = [(4, 2), (1, 1), (6, 2, 1, 2), (2, 2), (8, 2), (3, 1, 1, 1)]
    for i, (name, val) in enumerate(lab.ptq.items()):
        ax2.axhline(val, lw=1, color="grey", dashes=dashes[i % len(dashes)], label=name)
    ax1.set(xlabel="step", ylabel="training loss (EMA 0.9), nats/byte", title="training loss")
    ax2.set(xlabel="step", ylabel="validation loss, nats/byte", title="validation loss")
    ax3.set(xlabel="step", ylabel="nats/byte", title="training loss minus FP32's (EMA 0.98)")
    ax3.axhline(0.0, color="black", lw=0.8)
    finite = [v for r in lab.results for _, v in r.val_curve if math.isfinite(v)]
    if finite:
        lo, hi = min(finite), np.percentile(finite, 90)
        ax2.set_ylim(lo - 0.05 * (hi - lo + 0.1), hi + 0.1)
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7 if many else 8, ncol=2 if many else 1)
    m = lab.config.model
    fig.suptitle(
        f"lowbit train-lab: {m.n_layers}-layer d={m.d_model} decoder, {lab.config.steps} steps "
        "on CPython's docs (emulated on CPU: numerics, not speed)",
        fontsize=10,
    )
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def _ema(x: np.ndarray, beta: float) -> np.ndarray:
    out = np.empty_like(x)
    acc = x[0] if len(x) else 0.0
    for i, v in enumerate(x):
        acc = beta * acc + (1 - beta) * v if math.isfinite(v) else v
        out[i] = acc
    return out
