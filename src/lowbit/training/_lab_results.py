"""What a training-lab run is and what it produced: :class:`LabConfig`, :class:`RecipeResult`,
:class:`LabResult` (its comparisons against FP32, its summary table, its JSON form).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from lowbit.errors import LowbitError
from lowbit.training.model import ModelConfig

__all__ = ["EMULATION_NOTE", "LabConfig", "LabResult", "RecipeResult"]

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

    def claims(self) -> list[str]:
        """Plain sentences: what the run says about the textbook claims (what ``lowbit
        train-lab`` prints under its table)."""
        res = self.by_name()
        ref = res.get("fp32")
        out: list[str] = []
        if ref is None or not math.isfinite(ref.final_val):
            return out
        fp16 = res.get("fp16")
        if fp16 is not None:
            if fp16.diverged_at is not None:
                out.append(f"FP16 without loss scaling FAILED: inf/NaN gradients reached the "
                           f"weights at step {fp16.diverged_at + 1}.")  # fmt: skip
            else:
                rel = (fp16.final_val - ref.final_val) / ref.final_val
                verdict = "stalled" if rel > 0.02 else "did not fail"
                out.append(
                    f"FP16 without loss scaling {verdict}: val loss {fp16.final_val:.4f} "
                    f"({100 * rel:+.2f}% vs FP32); {100 * fp16.grad_underflow:.2f}% of gradient "
                    f"values underflowed to zero, {fp16.overflow} overflowed."
                )
        for name in ("fp16-scaled", "bf16", "fp8-hybrid"):
            r = res.get(name)
            if r is None:
                continue
            if not math.isfinite(r.final_val):
                out.append(f"{name} failed (diverged).")
                continue
            rel = (r.final_val - ref.final_val) / ref.final_val
            ok = "within" if abs(rel) <= 0.02 else "NOT within"
            extra = f", {r.skipped_steps} skipped steps" if r.name == "fp16-scaled" else ""
            out.append(f"{name} is {ok} 2% of FP32's validation loss ({100 * rel:+.2f}%{extra}).")
        for name, val in self.ptq.items():
            q = res.get("qat-" + name.removeprefix("ptq-"))
            if q is None or not math.isfinite(q.final_val):
                continue
            dq, dp = q.final_val - ref.final_val, val - ref.final_val
            closer = "closer to" if abs(dq) < abs(dp) else "NOT closer to"
            lower = "lower" if q.final_val < val else "higher"
            out.append(
                f"{q.name} ends {closer} FP32 than {name} (val loss {dq:+.4f} vs {dp:+.4f} nats/byte "
                f"from FP32's); its loss is {lower} than {name}'s."
            )
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
