"""Point labels that do not collide, for matplotlib scatter plots (``compare --plot``, the
report's PNG frontiers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["place_labels"]

# offsets in points tried in turn: right above, right below, left above, left below, then
# further down on the right
_TRIES = [(4, 4), (4, -12), (-4, 4), (-4, -12)] + [(4, 4 - 11 * k) for k in range(2, 12)]


def place_labels(
    points: Sequence[tuple[float, float]],
    ax: Any,
    labels: Sequence[str] | None = None,
    *,
    fontsize: float = 8,
) -> list[tuple[float, float]]:
    """Offsets (points) for labels of ``points`` such that no two label boxes overlap.

    Labels are placed in order of falling y; each takes the first offset of a fixed list
    whose box (about 0.6·fontsize wide per character, 1.2·fontsize high) is clear of the
    boxes placed before it. A negative x offset means the label ends at the point (use
    ``ha="right"``).

    Args:
        points: data coordinates.
        ax: the matplotlib axes (its data limits must already hold the points).
        labels: the texts (their lengths set the box widths; default 10 characters each).
        fontsize: the label font size in points.

    Returns:
        ``(dx, dy)`` per point, in the order given.
    """
    if not points:
        return []
    ax.autoscale_view()
    fig = ax.figure
    xy = ax.transData.transform(np.asarray(points, dtype=float)) * 72.0 / fig.dpi
    texts = list(labels) if labels is not None else ["x" * 10] * len(points)
    h = 1.2 * fontsize
    boxes: list[tuple[float, float, float, float]] = []
    out: list[tuple[float, float]] = [(4, 4)] * len(points)
    for i in sorted(range(len(points)), key=lambda i: -points[i][1]):
        w = 0.6 * fontsize * len(texts[i])
        x, y = xy[i]
        for dx, dy in _TRIES:
            x0 = x + dx if dx > 0 else x + dx - w
            box = (x0, y + dy, x0 + w, y + dy + h)
            if not any(_overlap(box, b) for b in boxes):
                break
        boxes.append(box)
        out[i] = (dx, dy)
    return out


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
