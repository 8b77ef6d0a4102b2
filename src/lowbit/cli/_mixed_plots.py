"""Pictures for mixed precision: the sensitivity scan and the chosen plan (matplotlib)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lowbit.checkpoints.io.outputs import save_figure
from lowbit.plans.presets import tensor_group
from lowbit.view._order import block_order
from lowbit.view.palette import KEPT, palette


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'lowbit[plot]'") from None
    return plt


def _save(fig: Any, out: Path, overwrite: bool) -> None:
    """Through the one output module: never over a file lowbit did not draw."""
    try:
        save_figure(fig, out, overwrite=overwrite, dpi=110)
    finally:
        _plt().close(fig)


def _kinds(names: list[str]) -> list[str]:
    return list(dict.fromkeys(tensor_group(n)[1] for n in names))


def plot_sensitivity(result: Any, out: Path, overwrite: bool = False) -> None:
    """One panel per tensor kind: damage (log scale) against layer, one line per scheme."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    table = result.table()
    kinds = _kinds(list(table))
    cols = min(4, len(kinds))
    rows = math.ceil(len(kinds) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols + 1.5, 2.8 * rows + 0.9),
                             squeeze=False, sharey=True)  # fmt: skip
    unit = "mean KL, nats" if result.kind == "causal" else "1 - cosine"
    damaged = result.measure in ("exact", "block")  # a damage per trial
    what = "damage" if damaged else "proxy"
    ylabel = f"{what} ({unit})" if damaged else f"{result.proxy} proxy (weighted sq. error)"
    for ax, kind in zip(axes.flat, kinds, strict=False):
        for scheme in result.schemes:
            pts = sorted(
                (tensor_group(n)[0] or 0, result.score(row[scheme]))
                for n, row in table.items()
                if tensor_group(n)[1] == kind and scheme in row
            )
            xs = [p[0] for p in pts]
            ys = [max(p[1], 1e-12) for p in pts]
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1,
                    label=scheme.removesuffix(":fp32"))  # fmt: skip
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(kind, fontsize=9)
        ax.set_xlabel("layer", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in list(axes.flat)[len(kinds) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8, title="scheme", title_fontsize=8)
    rho = result.rank_correlation()
    extra = f"; Spearman(proxy, exact) = {rho:.2f}" if rho is not None else ""
    fig.suptitle(f"{Path(result.model).name}: sensitivity of each tensor quantized alone "
                 f"({result.measure}){extra}", fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0, 0.88, 0.95))
    _save(fig, out, overwrite)


def plot_plan(mixed: Any, out: Path, title: str, overwrite: bool = False) -> None:
    """A kind x layer map of the chosen schemes: one colour per scheme (the report's palette,
    ``lowbit.view.palette``; kept tensors grey), kinds in the block's order, the scheme's
    bits written in each cell and a legend naming each scheme."""
    plt = _plt()
    import numpy as np
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    rows = [r for r in mixed.rows if r.layer is not None]
    if not rows:
        rows = list(mixed.rows)
    kinds = block_order(r.kind for r in rows)
    layers = sorted({r.layer or 0 for r in rows})

    def key(r: Any) -> str:
        return KEPT if r.scheme == "keep" else r.scheme

    pal = palette([(key(r), r.bits / r.numel if r.numel else math.nan) for r in rows])
    img = np.ones((len(kinds), len(layers), 3))
    text: dict[tuple[int, int], tuple[str, str]] = {}
    for r in rows:
        i, j = kinds.index(r.kind), layers.index(r.layer or 0)
        img[i, j] = to_rgb(pal[key(r)])
        light = sum(c * w for c, w in zip(img[i, j], (0.299, 0.587, 0.114), strict=True)) > 0.6
        digits = r.scheme.removesuffix(":fp32").split(":")[0].removeprefix("int")
        text[(i, j)] = ("-" if key(r) == KEPT else digits, "black" if light else "white")
    fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * len(layers) + 4.5), 0.45 * len(kinds) + 1.8))
    ax.imshow(img, aspect="auto", interpolation="nearest")
    if len(layers) <= 40:
        for (i, j), (t, colour) in text.items():
            ax.text(j, i, t, ha="center", va="center", fontsize=6, color=colour)
    ax.set_yticks(range(len(kinds)))
    ax.set_yticklabels(kinds, fontsize=7)
    step = max(1, len(layers) // 16)
    ax.set_xticks(range(0, len(layers), step))
    ax.set_xticklabels([str(x) for x in layers[::step]], fontsize=7)
    ax.set_xlabel("layer")
    handles = [Patch(facecolor=c, edgecolor="0.3", label=label) for c, label in pal.legend()]
    ax.legend(handles=handles, title="scheme (bits/weight)", loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=7, title_fontsize=7)  # fmt: skip
    schemes = ", ".join(f"{d['scheme'].removesuffix(':fp32')} x{d['tensors']}"
                        for d in mixed.by_scheme())  # fmt: skip
    ax.set_title(f"{title}\n{mixed.bits_per_weight:.3f} bits/weight: {schemes}", fontsize=9)
    fig.tight_layout()
    _save(fig, out, overwrite)
