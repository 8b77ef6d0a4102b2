"""Scatter labels placed by ``place_labels`` never overlap once drawn (compare --plot's
fp4/mxfp4/int4 cluster and schemes at the same bits and SQNR)."""

from __future__ import annotations

import pytest

from lowbit.view.labels import place_labels


def _boxes(points, labels):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for x, y in points:
        ax.scatter(x, y)
    offsets = place_labels(points, ax, labels)
    texts = [
        ax.annotate(t, p, xytext=o, textcoords="offset points", fontsize=8,
                    ha="left" if o[0] > 0 else "right")
        for t, p, o in zip(labels, points, offsets, strict=True)
    ]  # fmt: skip
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in texts]
    plt.close(fig)
    return offsets, boxes


def test_labels_do_not_overlap() -> None:
    """Four schemes on one spot and a cluster near 4.25-4.5 bits: the drawn text boxes of
    every pair are disjoint; a lone point keeps the default offset."""
    points = [(4.5, 18.0), (4.5, 18.0), (4.5, 18.0), (4.5, 18.0), (4.25, 17.9), (4.5, 18.2),
              (8.5, 40.0)]  # fmt: skip
    labels = ["int4:g128:fp32", "fp4:g128:fp32", "nf4:g128:fp32", "int4:g128:fp16", "mxfp4",
              "nf4:g64:fp32", "int8:ch:fp32"]  # fmt: skip
    offsets, boxes = _boxes(points, labels)
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (labels[i], labels[j])
    assert offsets[-1] == (4, 4)
