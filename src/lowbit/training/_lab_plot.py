"""The training lab's loss-curve figure: :func:`plot` (needs matplotlib)."""

from __future__ import annotations

import math
import os

import numpy as np

from lowbit.checkpoints.io.outputs import save_figure
from lowbit.training._lab_results import LabResult

__all__ = ["plot"]


def plot(lab: LabResult, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
    """Loss curves of every recipe on one PNG: training loss (smoothed) and validation loss.

    Needs matplotlib (``pip install 'lowbit[plot]'``). Written through
    ``lowbit.checkpoints.io.outputs.save_figure`` (an existing file is replaced only with
    ``overwrite`` and only when lowbit drew it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'lowbit[plot]'") from exc
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 7))
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
    same: dict[float, list[str]] = {}  # PTQ results at the same loss share one line and label
    for name, val in lab.ptq.items():
        same.setdefault(round(float(val), 4), []).append(name)
    for i, (val, names) in enumerate(same.items()):
        label = f"{', '.join(names)} (PTQ of FP32) = {val:.4g}"
        ax2.axhline(val, lw=1, color="grey", dashes=dashes[i % len(dashes)], label=label)
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
        if ax.lines:  # below the axes: a legend never hides a curve or another label
            ax.legend(fontsize=7 if many else 8, ncol=2 if many else 1, loc="upper center",
                      bbox_to_anchor=(0.5, -0.13), frameon=False)  # fmt: skip
    m = lab.config.model
    fig.suptitle(
        f"lowbit train-lab: {m.n_layers}-layer d={m.d_model} decoder, {lab.config.steps} steps "
        "on CPython's docs (emulated on CPU: numerics, not speed)",
        fontsize=10,
    )
    fig.tight_layout()
    try:
        save_figure(fig, path, overwrite=overwrite, dpi=110)
    finally:
        plt.close(fig)


def _ema(x: np.ndarray, beta: float) -> np.ndarray:
    out = np.empty_like(x)
    acc = x[0] if len(x) else 0.0
    for i, v in enumerate(x):
        acc = beta * acc + (1 - beta) * v if math.isfinite(v) else v
        out[i] = acc
    return out
