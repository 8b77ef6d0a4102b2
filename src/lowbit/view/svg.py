"""Tiny inline-SVG charts for the report page: no library, no network, text escaped.

Every chart is one ``<svg class="chart" data-chart=KIND>`` string with a ``<title>``, labelled
axes (with units) and, where colours or marks carry meaning, a legend. Elements a reader can
point at carry ``data-tip`` (shown by the page's tooltip script) and a ``<title>`` child (the
browser's own tooltip where scripts are off).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["bars", "colour", "heatmap", "histogram", "scatter"]


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def colour(t: float) -> str:
    """A colour for ``t`` in [0, 1] on a light-yellow to dark-red ramp (NaN: grey)."""
    if not math.isfinite(t):
        return "#d9d9d9"
    t = min(1.0, max(0.0, t))
    stops = [(255, 247, 188), (254, 196, 79), (236, 112, 20), (153, 52, 4)]
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(stops[i], stops[i + 1], strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    start = math.ceil(lo / step) * step
    return [start + k * step for k in range(int((hi - start) / step + 1e-9) + 1)]


def _num(v: float) -> str:
    if v == 0:
        return "0"
    return f"{v:.3g}"


def _open(kind: str, w: int, h: int, title: str) -> list[str]:
    return [
        f'<svg class="chart" data-chart="{kind}" '
        f'viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img">',
        f"<title>{_e(title)}</title>",
        f'<text class="title" x="{w / 2}" y="16" text-anchor="middle">{_e(title)}</text>',
    ]


def heatmap(
    rows: Sequence[str],
    cols: Sequence[str],
    values: Sequence[Sequence[float | None]],
    *,
    title: str,
    unit: str,
    tips: Sequence[Sequence[str]] | None = None,
    low_is_good: bool = True,
    categories: Sequence[Sequence[str | None]] | None = None,
    legend: Sequence[tuple[str, str, str]] = (),
    cell_width: int = 40,
) -> str:
    """A grid of coloured cells, one ``<rect class="cell">`` per (row, column) with a value.

    Args:
        rows: row labels (layers), top to bottom.
        cols: column labels (tensor kinds).
        values: ``values[i][j]``; None leaves the cell empty (no tensor there).
        title: the chart title.
        unit: what the colour measures, with its unit (shown on the colour bar).
        tips: tooltip text per cell.
        low_is_good: the colour ramp's direction: dark is the costly end.
        categories: a key per cell (a scheme, ``kept``): the cells take the colours of
            ``legend`` instead of the ramp, carry ``data-key``, and the colour bar becomes a
            list of swatches (``<g class="swatch" data-key=...>``) in ``legend``'s order.
        legend: ``(key, colour, label)`` of every key ``categories`` uses.
        cell_width: the width of a column in pixels.
    """
    longest = max((len(str(c)) for c in cols), default=1)
    rlongest = max((len(str(r)) for r in rows), default=1)
    # column labels are rotated by 50 degrees: about 6 px per character, sin 50 = 0.77
    cw, ch, left, top = cell_width, 16, 34 + 6 * rlongest, 36 + int(4.7 * longest)
    fills = {key: colour for key, colour, _ in legend}
    keyw = 30 + int(6.3 * max((len(label) for _, _, label in legend), default=0))
    w = left + cw * len(cols) + max(90, int(3.9 * longest), keyw if categories else 0)
    h = max(top + ch * len(rows) + 40, top + 30 + 17 * len(legend) if categories else 0)
    out = _open("heatmap", w, h, title)
    finite = [v for r in values for v in r if v is not None and math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    span = (hi - lo) or 1.0
    for j, c in enumerate(cols):
        x = left + cw * j + cw / 2
        out.append(
            f'<text class="col" x="{x}" y="{top - 6}" transform="rotate(-50 {x} {top - 6})">'
            f"{_e(c)}</text>"
        )
    for i, r in enumerate(rows):
        y = top + ch * i
        out.append(
            f'<text class="row" x="{left - 6}" y="{y + ch - 4}" text-anchor="end">{_e(r)}</text>'
        )
        for j in range(len(cols)):
            v = values[i][j]
            if v is None:
                continue
            t = (v - lo) / span if math.isfinite(v) else math.nan
            fill = colour(t if low_is_good else 1 - t)
            key = ""
            if categories is not None and categories[i][j] is not None:
                fill = fills[categories[i][j]]  # type: ignore[index]
                key = f' data-key="{_e(categories[i][j])}"'
            tip = tips[i][j] if tips else f"{r} {cols[j]}: {_num(v)} {unit}"
            out.append(
                f'<rect class="cell" x="{left + cw * j}" y="{y}" width="{cw - 1}" '
                f'height="{ch - 1}" fill="{fill}"{key} data-tip="{_e(tip)}">'
                f"<title>{_e(tip)}</title></rect>"
            )
    if categories is not None:
        out += _swatches(left + cw * len(cols) + 16, top, legend, unit)
        out += _layer_axis(top, ch * len(rows))
        out.append("</svg>")
        return "".join(out)
    # colour bar: the legend of the colours
    bx, by, bh = left + cw * len(cols) + 20, top, max(60, ch * len(rows))
    for k in range(20):
        t = k / 19
        out.append(
            f'<rect class="legend" x="{bx}" y="{by + bh * (19 - k) / 20:.1f}" width="14" '
            f'height="{bh / 20 + 0.5}" fill="{colour(t if low_is_good else 1 - t)}"/>'
        )
    out.append(f'<text x="{bx + 18}" y="{by + 8}">{_e(_num(hi))}</text>')
    out.append(f'<text x="{bx + 18}" y="{by + bh}">{_e(_num(lo))}</text>')
    out.append(
        f'<text class="axis" x="{bx + 7}" y="{by + bh + 18}" text-anchor="middle">{_e(unit)}</text>'
    )
    out += _layer_axis(top, ch * len(rows))
    out.append("</svg>")
    return "".join(out)


def _layer_axis(top: float, height: float) -> list[str]:
    mid = top + height / 2
    return [
        f'<text class="axis" x="12" y="{mid}" transform="rotate(-90 12 {mid})" '
        'text-anchor="middle">layer</text>'
    ]


def _swatches(x: float, y: float, legend: Sequence[tuple[str, str, str]], unit: str) -> list[str]:
    """A heading and one swatch per category: a square of its colour and its label."""
    out = [f'<text class="axis" x="{x}" y="{y + 6}">{_e(unit)}</text>']
    for k, (key, fill, label) in enumerate(legend):
        yk = y + 14 + 17 * k
        out.append(
            f'<g class="swatch" data-key="{_e(key)}" transform="translate({x},{yk})">'
            f'<rect x="0" y="0" width="14" height="14" fill="{fill}" stroke="#555" '
            f'stroke-width="0.5"/><text x="20" y="11">{_e(label)}</text></g>'
        )
    return out


class _Axes:
    def __init__(self, w: int, h: int, xr: tuple[float, float], yr: tuple[float, float]):
        self.l, self.r, self.t, self.b = 60, w - 20, 30, h - 45
        self.xr, self.yr = xr, yr

    def x(self, v: float) -> float:
        lo, hi = self.xr
        return self.l + (v - lo) / ((hi - lo) or 1.0) * (self.r - self.l)

    def y(self, v: float) -> float:
        lo, hi = self.yr
        return self.b - (v - lo) / ((hi - lo) or 1.0) * (self.b - self.t)

    def frame(self, xlabel: str, ylabel: str) -> list[str]:
        out = [
            f'<line class="axis" x1="{self.l}" y1="{self.b}" x2="{self.r}" y2="{self.b}"/>',
            f'<line class="axis" x1="{self.l}" y1="{self.t}" x2="{self.l}" y2="{self.b}"/>',
        ]
        for v in _ticks(*self.xr):
            out.append(
                f'<text class="tick" x="{self.x(v):.1f}" y="{self.b + 14}" '
                f'text-anchor="middle">{_num(v)}</text>'
            )
        for v in _ticks(*self.yr):
            out.append(
                f'<text class="tick" x="{self.l - 4}" y="{self.y(v) + 4:.1f}" '
                f'text-anchor="end">{_num(v)}</text>'
            )
        mid = (self.t + self.b) / 2
        out.append(
            f'<text class="axis" x="{(self.l + self.r) / 2}" y="{self.b + 34}" '
            f'text-anchor="middle">{_e(xlabel)}</text>'
        )
        out.append(
            f'<text class="axis" x="14" y="{mid}" transform="rotate(-90 14 {mid})" '
            f'text-anchor="middle">{_e(ylabel)}</text>'
        )
        return out


def _legend(x: float, y: float, items: Sequence[tuple[str, str]]) -> list[str]:
    out = [f'<g class="legend-box" transform="translate({x},{y})">']
    for k, (mark, label) in enumerate(items):
        out.append(f'<g transform="translate(0,{14 * k})">{mark}')
        out.append(f'<text x="16" y="4">{_e(label)}</text></g>')
    out.append("</g>")
    return out


def histogram(
    edges: Sequence[float],
    counts: Sequence[int],
    levels: Sequence[float],
    *,
    title: str,
    xlabel: str,
    w: int = 460,
    h: int = 240,
    level_colour: str | None = None,
) -> str:
    """Bars of a histogram (``<rect class="bar">``) with one vertical ``<line class="level">``
    per level the format can take, in ``level_colour`` when given (the scheme's colour on the
    page); legend marks carry the class ``key``."""
    xr = (
        min(edges[0], *levels) if levels else edges[0],
        max(edges[-1], *levels) if levels else edges[-1],
    )
    ax = _Axes(w, h, xr, (0, max(max(counts), 1) * 1.05))
    out = _open("histogram", w, h, title)
    out += ax.frame(xlabel, "values in the group (count)")
    for k, c in enumerate(counts):
        x0, x1 = ax.x(edges[k]), ax.x(edges[k + 1])
        tip = f"[{_num(edges[k])}, {_num(edges[k + 1])}): {c} values"
        out.append(
            f'<rect class="bar" x="{x0:.2f}" y="{ax.y(c):.2f}" width="{max(x1 - x0 - 0.5, 0.5):.2f}" '
            f'height="{ax.b - ax.y(c):.2f}" data-tip="{_e(tip)}"><title>{_e(tip)}</title></rect>'
        )
    stroke = f' style="stroke:{level_colour}"' if level_colour else ""
    for v in levels:
        x = ax.x(v)
        out.append(
            f'<line class="level" x1="{x:.2f}" y1="{ax.t}" x2="{x:.2f}" y2="{ax.b}"{stroke} '
            f'data-tip="level {_num(v)}"><title>level {_e(_num(v))}</title></line>'
        )
    out += _legend(
        ax.r - 150,
        ax.t + 6,
        [
            ('<rect class="bar key" x="0" y="-5" width="10" height="10"/>', "source values"),
            (
                f'<line class="level key" x1="5" y1="-6" x2="5" y2="6"{stroke}/>',
                "levels of the format",
            ),
        ],
    )
    out.append("</svg>")
    return "".join(out)


def scatter(
    points: Sequence[tuple[float, float, str, bool]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    w: int = 460,
    h: int = 240,
    chosen_colour: str | None = None,
) -> str:
    """Points ``(x, y, label, highlighted)`` as ``<circle class="point">`` with the Pareto
    frontier (fewest x for the most y) as one ``<path class="frontier">``; highlighted points
    in ``chosen_colour`` when given (the scheme's colour on the page). Labels that would
    overlap an earlier label are moved down a line."""
    pts = [p for p in points if math.isfinite(p[0]) and math.isfinite(p[1])]
    xs = [p[0] for p in pts] or [0.0, 1.0]
    ys = [p[1] for p in pts] or [0.0, 1.0]
    xpad = (max(xs) - min(xs)) * 0.1 or 0.5
    ypad = (max(ys) - min(ys)) * 0.15 or 1.0
    ax = _Axes(w, h, (min(xs) - xpad, max(xs) + xpad * 3), (min(ys) - ypad, max(ys) + ypad))
    out = _open("scatter", w, h, title)
    out += ax.frame(xlabel, ylabel)
    front = []
    best = -math.inf
    for p in sorted(pts, key=lambda p: (p[0], -p[1])):
        if p[1] > best:
            front.append(p)
            best = p[1]
    if front:
        d = " ".join(
            f"{'M' if k == 0 else 'L'}{ax.x(p[0]):.1f},{ax.y(p[1]):.1f}"
            for k, p in enumerate(front)
        )
        out.append(f'<path class="frontier" d="{d}"/>')
    placed: list[tuple[float, float]] = []
    fill = f' style="fill:{chosen_colour}"' if chosen_colour else ""
    for x, y, label, hi in sorted(pts, key=lambda p: -p[1]):
        px, py = ax.x(x), ax.y(y)
        ly = py - 5
        while any(abs(px - qx) < 70 and abs(ly - qy) < 11 for qx, qy in placed):
            ly += 11
        placed.append((px, ly))
        tip = f"{label}: {x:.3f} bits/weight, {y:.2f} dB"
        cls = "point chosen" if hi else "point"
        out.append(
            f'<circle class="{cls}"{fill if hi else ""} cx="{px:.1f}" cy="{py:.1f}" '
            f'r="{5 if hi else 3.5}" '
            f'data-tip="{_e(tip)}"><title>{_e(tip)}</title></circle>'
        )
        out.append(f'<text class="label" x="{px + 6:.1f}" y="{ly:.1f}">{_e(label)}</text>')
    out += _legend(
        ax.l + 10,
        ax.t + 8,  # top left: the points rise from bottom left to top right
        [
            (
                f'<circle class="point chosen key"{fill} cx="5" cy="0" r="5"/>',
                "the checkpoint's scheme",
            ),
            ('<circle class="point key" cx="5" cy="0" r="3.5"/>', "another scheme"),
            ('<path class="frontier key" d="M0,0 L10,0"/>', "best SQNR for its bits"),
        ],
    )
    out.append("</svg>")
    return "".join(out)


def bars(
    items: Sequence[tuple[str, float]],
    *,
    title: str,
    unit: str,
    w: int = 460,
    fills: Sequence[str] | None = None,
) -> str:
    """Horizontal bars, one ``<rect class="hbar">`` per ``(label, value)``, each in its
    ``fills`` colour when given (the page's scheme colours)."""
    bh = 18
    h = 40 + bh * len(items) + 30
    vmax = max((v for _, v in items if math.isfinite(v)), default=1.0) or 1.0
    out = _open("bars", w, h, title)
    left, right = 170, w - 60
    for k, (label, v) in enumerate(items):
        y = 30 + bh * k
        length = (right - left) * (v / vmax if math.isfinite(v) else 0)
        tip = f"{label}: {_num(v)} {unit}"
        fill = f' style="fill:{fills[k]}" data-key="{_e(label)}"' if fills else ""
        out.append(
            f'<text class="row" x="{left - 6}" y="{y + bh - 5}" text-anchor="end">{_e(label)}</text>'
        )
        out.append(
            f'<rect class="hbar" x="{left}" y="{y}" width="{max(length, 0.5):.1f}" '
            f'height="{bh - 3}"{fill} data-tip="{_e(tip)}"><title>{_e(tip)}</title></rect>'
        )
        out.append(
            f'<text class="tick" x="{left + length + 4:.1f}" y="{y + bh - 5}">{_num(v)}</text>'
        )
    out.append(
        f'<text class="axis" x="{(left + right) / 2}" y="{h - 8}" text-anchor="middle">'
        f"{_e(unit)}</text>"
    )
    out.append("</svg>")
    return "".join(out)
