"""The report's figures as PNG files (matplotlib), for papers and issues.

Each figure has a title, axis labels with units and a legend or colour bar; files go through
``lowbit.checkpoints.io.outputs.save_figure`` (never over a file lowbit did not write).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints.io.outputs import save_figure
from lowbit.errors import LowbitError
from lowbit.view.labels import place_labels
from lowbit.view.palette import KEPT_COLOUR, Palette
from lowbit.view.report import Report, TensorRow

__all__ = ["write_pngs"]


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--png needs matplotlib: pip install 'lowbit[plot]'") from None
    return plt


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "tensor"


def write_pngs(
    report: Report, folder: str | os.PathLike[str], *, overwrite: bool = False
) -> list[Path]:
    """Write the report's figures into a folder (made when only it is missing).

    Returns:
        The files written: ``bits.png`` (one colour per scheme, the page's), ``error.png``
        (with a source), for a mixture-of-experts checkpoint ``bits-GROUP.png`` and
        ``error-GROUP.png`` per expert kind (layers x experts), ``formats.png``, and per
        worst tensor ``hist-NAME.png`` and ``frontier-NAME.png``.

    Raises:
        LowbitError: the folder does not exist, or a file exists that ``overwrite`` may not
            replace.
    """

    plt = _plt()
    out = Path(folder)
    if not out.is_dir():
        if out.exists() or not out.parent.is_dir():
            raise LowbitError(
                f"--png {out}: not a folder, and its parent is no folder to make it in"
            )
        out.mkdir()
    figures: list[tuple[str, Any]] = []
    pal = report.palette()
    layers, kinds = report.grid()
    inside = [x for x in report.rows if x.layer is not None]
    grids = [("", kinds, {(x.layer, x.kind): x for x in inside})] if kinds else []
    cells = report.expert_cells()
    for group, experts in report.experts():
        grids.append((group, [str(e) for e in experts], cells[group]))
    for group, cols, at in grids if layers else []:
        suffix = f"-{_slug(group.replace('.*.', '.'))}" if group else ""
        what = f"experts {group}" if group else "tensor kind"
        figures.append((f"bits{suffix}.png", _scheme_grid(plt, pal, layers, cols, at, what)))
        grid = np.array([[_val(at.get((layer, c)), "rel_fro") for c in cols] for layer in layers])
        if np.isnan(grid).all():
            continue
        fig, ax = plt.subplots(figsize=(2.5 + 0.6 * len(cols), 3.5 + 0.25 * len(layers)))
        im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="YlOrBr")
        _axes(ax, layers, cols, what)
        ax.set_title("relative Frobenius error ‖W−Ŵ‖/‖W‖ across layers")
        fig.colorbar(im, ax=ax, label="relative error")
        fig.tight_layout()
        figures.append((f"error{suffix}.png", fig))
    fmts = report.formats()
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.35 * len(fmts)))
    ax.barh([s if s in pal else f"{s} (kept)" for s, _, _ in fmts], [w / 1e6 for _, _, w in fmts],
            color=[pal.get(s, KEPT_COLOUR) for s, _, _ in fmts])  # fmt: skip
    ax.invert_yaxis()
    ax.set_xlabel("million weights")
    ax.set_title("weights stored in each format (colours as in bits.png)")
    fig.tight_layout()
    figures.append(("formats.png", fig))
    for d in report.details:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.stairs(d.counts, d.edges, fill=True, color="0.65", label="source values of the group")
        for k, v in enumerate(d.levels):
            ax.axvline(v, color=pal.get(d.scheme, "0.2"), lw=0.8,
                       label="levels of the format" if k == 0 else None)  # fmt: skip
        ax.set_xlabel("weight value")
        ax.set_ylabel("count")
        ax.set_title(f"{d.name} ({d.scheme}): {d.group}", fontsize=9)
        ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        figures.append((f"hist-{_slug(d.name)}.png", fig))
        fig, ax = plt.subplots(figsize=(7, 4.5))
        pts = [c for c in d.candidates if math.isfinite(c.sqnr_db)]
        front, best = [], -math.inf
        for c in sorted(pts, key=lambda c: (c.bits, -c.sqnr_db)):
            if c.sqnr_db > best:
                front.append(c)
                best = c.sqnr_db
        ax.plot([c.bits for c in front], [c.sqnr_db for c in front], color="0.3",
                label="best SQNR for its bits")  # fmt: skip
        own = pal.get(d.scheme, "0.2")
        for c in pts:
            ax.scatter(c.bits, c.sqnr_db, color=own if c.chosen else "white", zorder=3,
                       edgecolors="black" if c.chosen else "0.35", s=50 if c.chosen else 20)  # fmt: skip
        ax.scatter([], [], color=own, edgecolors="black", label="the checkpoint's scheme")
        ax.scatter([], [], color="white", edgecolors="0.35", label="candidate scheme")
        _annotate(ax, pts)
        ax.set_xlabel("bits per weight (scales included)")
        ax.set_ylabel("SQNR (dB)")
        ax.set_title(f"{d.name}: error vs bits of candidate schemes", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        figures.append((f"frontier-{_slug(d.name)}.png", fig))
    written = []
    try:
        for name, fig in figures:
            save_figure(fig, out / name, overwrite=overwrite, dpi=110)
            written.append(out / name)
    finally:
        for _, fig in figures:
            plt.close(fig)
    return written


def _axes(ax: Any, layers: list[int], cols: list[str], what: str) -> None:
    ax.set_xticks(range(len(cols)), cols, rotation=50, ha="right", fontsize=8)
    ax.set_yticks(range(len(layers)), [str(v) for v in layers], fontsize=7)
    ax.set_xlabel(what)
    ax.set_ylabel("layer")


def _scheme_grid(
    plt: Any,
    pal: Palette,
    layers: list[int],
    cols: list[str],
    at: dict[tuple[int, str], TensorRow],
    what: str,
) -> Any:
    """Layers x columns, each cell in its scheme's colour (white: no tensor), and a legend of
    the schemes shown, cheapest first: the page's bits grid."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    img = np.ones((len(layers), len(cols), 3))
    shown = set()
    for i, layer in enumerate(layers):
        for j, c in enumerate(cols):
            x = at.get((layer, c))
            if x is not None:
                img[i, j] = to_rgb(pal[x.colour_key])
                shown.add(x.colour_key)
    fig, ax = plt.subplots(figsize=(4.5 + 0.6 * len(cols), 3.5 + 0.25 * len(layers)))
    ax.imshow(img, aspect="auto", interpolation="nearest")
    _axes(ax, layers, cols, what)
    ax.set_xticks(np.arange(len(cols) + 1) - 0.5, minor=True)  # white lines between cells
    ax.set_yticks(np.arange(len(layers) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    ax.set_title("scheme of each tensor across layers")
    handles = [
        Patch(facecolor=colour, edgecolor="0.3", label=label)
        for (key, colour, _), (_, label) in zip(pal.entries, pal.legend(), strict=True)
        if key in shown
    ]
    ax.legend(handles=handles, title="scheme (bits/weight)", loc="upper left",
              bbox_to_anchor=(1.02, 1.0), fontsize=8, title_fontsize=8)  # fmt: skip
    fig.tight_layout()
    return fig


def _val(row: Any, key: str) -> float:
    v = None if row is None else getattr(row, key)
    return math.nan if v is None else float(v)


def _annotate(ax: Any, pts: list[Any]) -> None:
    """Label points, pushing a label down a line while it would sit on an earlier one (schemes
    that share bits per weight and SQNR, such as int4:g32 and fp4:g32, no longer collide)."""

    offsets = place_labels([(c.bits, c.sqnr_db) for c in pts], ax, [c.scheme for c in pts])
    for c, (dx, dy) in zip(pts, offsets, strict=True):
        ax.annotate(c.scheme, (c.bits, c.sqnr_db), xytext=(dx, dy), textcoords="offset points",
                    fontsize=8, ha="left" if dx > 0 else "right")  # fmt: skip
