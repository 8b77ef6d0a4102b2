"""The inline-SVG charts: one element per datum, escaped text, the Pareto frontier."""

from __future__ import annotations

import math
import re

from lowbit.view import svg


def test_heatmap_cells_and_escaping() -> None:
    """A rect per non-None value, none for a missing tensor, names escaped, a colour bar."""
    out = svg.heatmap(["0", "1"], ["a<b", "c"], [[1.0, None], [2.0, math.inf]],
                      title="t & u", unit="bits")  # fmt: skip
    assert out.count('class="cell"') == 3
    assert "a&lt;b" in out and "t &amp; u" in out and "a<b" not in out
    assert out.count('class="legend"') == 20


def test_histogram_levels_and_bars() -> None:
    """A bar per bin and a line per level, besides the legend's key marks."""
    out = svg.histogram([0.0, 1.0, 2.0, 3.0], [1, 5, 2], [-1.0, 0.5, 2.5], title="h",
                        xlabel="v")  # fmt: skip
    assert len(re.findall(r'class="bar"', out)) == 3
    assert len(re.findall(r'class="level"', out)) == 3


def test_scatter_frontier_is_pareto() -> None:
    """The frontier joins, by rising bits, only points with more SQNR than every cheaper one."""
    pts = [(4.0, 10.0, "a", False), (4.5, 9.0, "b", False), (5.0, 20.0, "c", True),
           (8.0, 40.0, "d", False), (8.0, 30.0, "e", False)]  # fmt: skip
    out = svg.scatter(pts, title="s", xlabel="bits", ylabel="dB")
    path = re.search(r'<path class="frontier" d="([^"]+)"', out).group(1)
    assert path.count("L") == 2  # a -> c -> d
    assert out.count('class="point chosen"') == 1


def test_heatmap_categories_take_legend_colours() -> None:
    """With categories, each cell is its key's legend colour and carries the key; the legend
    is one swatch per entry in order, with no colour bar."""
    legend = [("int4", "#0072b2", "int4 (4.50)"), ("kept", "#bdbdbd", "kept as stored")]
    out = svg.heatmap(["0", "1"], ["q", "k"], [[4.5, 32.0], [4.5, None]], title="t",
                      unit="scheme", categories=[["int4", "kept"], ["int4", None]],
                      legend=legend)  # fmt: skip
    cells = re.findall(r'<rect class="cell"[^>]*fill="(#[0-9a-f]+)" data-key="([^"]+)"', out)
    assert cells == [("#0072b2", "int4"), ("#bdbdbd", "kept"), ("#0072b2", "int4")]
    swatches = re.findall(r'<g class="swatch" data-key="([^"]+)".*?fill="(#[0-9a-f]+)"', out)
    assert swatches == [("int4", "#0072b2"), ("kept", "#bdbdbd")]
    assert 'class="legend"' not in out and "kept as stored" in out
