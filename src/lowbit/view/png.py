"""The report's figures as PNG files (matplotlib), for papers and issues.

Each figure has a title, axis labels with units and a legend or colour bar; files go through
``lowbit.checkpoints._outputs.save_figure`` (never over a file lowbit did not write).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints._outputs import save_figure
from lowbit.errors import LowbitError
from lowbit.view.labels import place_labels
from lowbit.view.report import Report

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
        The files written: ``bits.png``, ``error.png`` (with a source), ``formats.png``, and
        per worst tensor ``hist-NAME.png`` and ``frontier-NAME.png``.

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
    layers, kinds = report.grid()
    if layers:
        at = {(x.layer, x.kind): x for x in report.rows if x.layer is not None}
        for key, title, unit in (
            ("bits", "bits per weight across layers (scales included)", "bits/weight"),
            ("rel_fro", "relative Frobenius error ‖W−Ŵ‖/‖W‖ across layers", "relative error"),
        ):
            grid = np.array(
                [[_val(at.get((layer, k)), key) for k in kinds] for layer in layers], dtype=float
            )
            if np.isnan(grid).all():
                continue
            fig, ax = plt.subplots(figsize=(2.5 + 0.6 * len(kinds), 3.5 + 0.25 * len(layers)))
            im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="YlOrBr")
            ax.set_xticks(range(len(kinds)), kinds, rotation=50, ha="right", fontsize=8)
            ax.set_yticks(range(len(layers)), [str(v) for v in layers], fontsize=7)
            ax.set_xlabel("tensor kind")
            ax.set_ylabel("layer")
            ax.set_title(title)
            fig.colorbar(im, ax=ax, label=unit)
            fig.tight_layout()
            figures.append(("bits.png" if key == "bits" else "error.png", fig))
    fmts = report.formats()
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.35 * len(fmts)))
    ax.barh([s for s, _, _ in fmts], [w / 1e6 for _, _, w in fmts], color="C0",
            label="weights stored in the format")  # fmt: skip
    ax.invert_yaxis()
    ax.set_xlabel("million weights")
    ax.set_title("weights stored in each format")
    ax.legend(loc="lower right")
    fig.tight_layout()
    figures.append(("formats.png", fig))
    for d in report.details:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.stairs(d.counts, d.edges, fill=True, color="0.65", label="source values of the group")
        for k, v in enumerate(d.levels):
            ax.axvline(v, color="C3", lw=0.7, label="levels of the format" if k == 0 else None)
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
        ax.plot([c.bits for c in front], [c.sqnr_db for c in front], color="C2",
                label="best SQNR for its bits")  # fmt: skip
        for c in pts:
            ax.scatter(c.bits, c.sqnr_db, color="C3" if c.chosen else "C0", zorder=3,
                       s=40 if c.chosen else 20)  # fmt: skip
        ax.scatter([], [], color="C3", label="the checkpoint's scheme")
        ax.scatter([], [], color="C0", label="candidate scheme")
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
