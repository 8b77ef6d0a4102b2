"""The report page: one self-contained HTML file (inline CSS and SVG, a few lines of script for
sorting the table and showing tooltips; nothing fetched from the network)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape
from typing import Any

from lowbit.checkpoints.io.marks import writer_tag
from lowbit.view import svg
from lowbit.view.palette import KEPT_COLOUR, Palette
from lowbit.view.report import Report, TensorRow

__all__ = ["GENERATOR", "render"]

#: The ``<meta name="generator">`` line that marks a page as lowbit's (so ``--overwrite`` may
#: replace it; see ``lowbit.checkpoints.io.marks``).
GENERATOR = '<meta name="generator" content="{tag}">'

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1240px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
dl.summary{display:grid;grid-template-columns:max-content auto;gap:2px 16px}
dl.summary dt{color:#555}dl.summary dd{margin:0}
.chart{font:11px system-ui,sans-serif;background:#fff;margin:4px 8px 12px 0;overflow:visible}
.chart .title{font-size:13px;font-weight:600}.chart .axis{stroke:#444;fill:#333}
.chart text.axis{stroke:none}.chart .tick{fill:#555}
.chart .bar{fill:#b8b8b8}.chart .level{stroke:#333;stroke-width:1}
.chart .hbar{fill:#888}.chart .frontier{fill:none;stroke:#444;stroke-width:1.5}
.chart .point{fill:#fff;stroke:#555;stroke-width:1}.chart .point.chosen{fill:#333;stroke:#000}
.sw{display:inline-block;width:10px;height:10px;border:1px solid #777;margin-right:3px}
.chart .label{font-size:10px;fill:#333}.chart .cell:hover{stroke:#000}
.pair{display:flex;flex-wrap:wrap;align-items:flex-start}
table{border-collapse:collapse;font-size:12px}th,td{padding:2px 8px;border-bottom:1px solid #eee}
th{background:#f4f4f4;cursor:pointer;position:sticky;top:0;text-align:left}
th.sorted-asc::after{content:" ▲"}th.sorted-desc::after{content:" ▼"}
td.n{text-align:right;font-variant-numeric:tabular-nums}
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;padding:3px 6px;
border-radius:3px;font-size:12px;display:none;z-index:9}
.note{color:#666;font-size:12px}
"""

_JS = """
(function(){
  var tip=document.getElementById('tip');
  document.addEventListener('mouseover',function(e){
    var t=e.target.closest('[data-tip]');
    if(!t){tip.style.display='none';return;}
    tip.textContent=t.getAttribute('data-tip');tip.style.display='block';
  });
  document.addEventListener('mousemove',function(e){
    tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';
  });
  document.querySelectorAll('table.sortable').forEach(function(table){
    table.querySelectorAll('th').forEach(function(th,col){
      th.addEventListener('click',function(){
        var asc=!th.classList.contains('sorted-asc');
        table.querySelectorAll('th').forEach(function(h){h.classList.remove('sorted-asc','sorted-desc');});
        th.classList.add(asc?'sorted-asc':'sorted-desc');
        var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
        var num=th.getAttribute('data-type')==='num';
        rows.sort(function(a,b){
          var x=a.cells[col].getAttribute('data-v'),y=b.cells[col].getAttribute('data-v'),r;
          if(num){
            x=x===''?NaN:parseFloat(x);y=y===''?NaN:parseFloat(y);
            if(isNaN(x)||isNaN(y)){return isNaN(x)?(isNaN(y)?0:1):-1;}
            r=x<y?-1:(x>y?1:0);
          }else{r=x.localeCompare(y);}
          return asc?r:-r;
        });
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
})();
"""


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.2f} MB"


def _num(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    return f"{v:.{digits}g}"


def render(report: Report) -> str:
    """The report page as one HTML string (UTF-8, no external resources)."""

    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        GENERATOR.format(tag=_e(writer_tag())),
        f"<title>lowbit report: {_e(report.path)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>lowbit report: {_e(report.path)}</h1>",
        _summary(report),
        _grids(report),
        _formats(report),
        _scale_rules(report),
        _details(report),
        _sensitivity(report),
        _table(report),
        '<div id="tip"></div>',
        f"<script>{_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _summary(r: Report) -> str:
    items: list[tuple[str, str]] = [
        ("checkpoint", f"{_e(r.path)} ({_e(r.format)})"),
        (
            "source",
            f"{_e(r.source)} ({_e(r.source_format)})"
            if r.source_format
            else (f"{_e(r.source)} (not found: no errors measured)" if r.source else "none given"),
        ),
        ("size", f"{_mb(r.source_bytes)} → {_mb(r.size_bytes)}"),
        ("tensors", f"{len(r.rows)} ({len(r.quantized)} quantized)"),
        (
            "bits/weight",
            f"{r.bits_per_weight:.3f} over all tensors, {r.quantized_bits_per_weight:.3f} over "
            "the quantized ones (scales and zero points included)",
        ),
        (
            "formats used",
            ", ".join(
                f'<span class="sw" style="background:{_scheme_colour(r, s)}"></span>'
                f"{_e(s)} ({t} tensors, {w / 1e6:,.2f} M weights)"
                for s, t, w in r.formats()
            ),
        ),
    ]
    if r.plan is not None:
        rules = r.rules_fired()
        listed = r.plan.get("rules") if isinstance(r.plan.get("rules"), list) else []
        fired = (
            ", ".join(
                f"{_e(k)} <code>{_e(json.dumps(_nth(listed, k), sort_keys=True))}</code> "
                f"({n} tensors)"
                for k, n in rules
            )
            or "none (every tensor followed the defaults)"
        )
        items.append(("plan", f"<code>{_e(json.dumps(r.plan, sort_keys=True))}</code>"))
        items.append(("rules that fired", fired))
    errs = [x for x in r.quantized if x.sqnr_db is not None and math.isfinite(x.sqnr_db)]
    if errs:
        worst = min(errs, key=lambda x: x.sqnr_db)  # type: ignore[arg-type,return-value]
        items.append(
            (
                "worst tensor",
                f"{_e(worst.name)}: SQNR {worst.sqnr_db:.2f} dB, rel. error {_num(worst.rel_fro)}",
            )
        )
    items.append(
        (
            "took",
            f"{r.seconds.get('tensors', 0):.1f} s for the tensors, "
            f"{r.seconds.get('details', 0):.1f} s for the worst tensors' candidates",
        )
    )
    out = ['<h2 id="summary">Summary</h2><dl class="summary">']
    out += [f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items]
    out.append("</dl>")
    if r.evaluation is not None:
        out.append('<h2 id="evaluation">Evaluation</h2>' + _evaluation(r.evaluation))
    return "".join(out)


def _nth(rules: list[Any], label: str) -> Any:
    """The plan rule a ``rule N`` label names (the label itself when it names none)."""
    try:
        return rules[int(label.removeprefix("rule "))]
    except (ValueError, IndexError):
        return label


def _evaluation(ev: Any) -> str:
    rows = ev.get("rows") if isinstance(ev, dict) else ev
    if isinstance(rows, list) and rows and all(isinstance(x, dict) for x in rows):
        # at most 1,000 rows of 40 columns: a file of rows with their own keys each made the
        # table rows x keys (quadratic in the file)
        rows = rows[:1000]
        keys = list(dict.fromkeys(k for x in rows for k in x if not isinstance(x[k], (dict, list))))
        keys = keys[:40]
        head = "".join(f"<th>{_e(k)}</th>" for k in keys)
        body = "".join(
            "<tr>" + "".join(f"<td>{_e(_cell(x.get(k)))}</td>" for k in keys) + "</tr>"
            for x in rows
        )
        extra = ""
        if isinstance(ev, dict):
            rest = {k: v for k, v in ev.items() if k != "rows"}
            extra = f'<p class="note">{_e(json.dumps(rest, default=str)[:2000])}</p>'
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{extra}"
    return f"<pre>{_e(json.dumps(ev, indent=2, default=str)[:20000])}</pre>"


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return _num(v, 5)
    return "-" if v is None else str(v)


def _grid_values(
    layers: list[int], cols: list[str], at: dict[tuple[int, str], TensorRow], key: str
) -> tuple[list[list[float | None]], list[list[str]], list[list[str | None]]]:
    """Per cell (layer, column): the row's ``key`` value, its tooltip and its colour key."""
    values: list[list[float | None]] = []
    tips: list[list[str]] = []
    cats: list[list[str | None]] = []
    for layer in layers:
        x = [at.get((layer, c)) for c in cols]
        values.append([None if t is None else getattr(t, key) for t in x])
        tips.append(["" if t is None else _tip(t) for t in x])
        cats.append([None if t is None else t.colour_key for t in x])
    return values, tips, cats


def _tip(x: TensorRow) -> str:
    err = "" if x.sqnr_db is None else f", SQNR {_num(x.sqnr_db)} dB, rel. error {_num(x.rel_fro)}"
    stored = " (kept as stored)" if x.stored == "kept" else ""
    return f"{x.name}: {x.scheme}{stored}, {x.bits:.3f} bits/weight{err}"


def _scheme_colour(r: Report, scheme: str) -> str:
    """The page's colour of a scheme of ``Report.formats`` (kept dtypes: kept's grey)."""
    return r.palette().get(scheme, KEPT_COLOUR)  # a kept tensor's scheme is its dtype


def _legend(pal: Palette, shown: set[str]) -> list[tuple[str, str, str]]:
    """The swatches of the keys a grid shows, in the palette's order (cheapest first)."""
    return [
        (key, colour, label)
        for (key, colour, _), (_, label) in zip(pal.entries, pal.legend(), strict=True)
        if key in shown
    ]


def _grid_pair(
    r: Report,
    layers: list[int],
    cols: list[str],
    at: dict[tuple[int, str], TensorRow],
    what: str,
    cell_width: int = 40,
) -> str:
    """The bits grid (one colour per scheme) and, with a source, the error grid."""
    pal = r.palette()
    bits, tips, cats = _grid_values(layers, cols, at, "bits")
    rows = [str(v) for v in layers]
    shown = {c for row in cats for c in row if c is not None}
    out = [
        svg.heatmap(
            rows,
            cols,
            bits,
            title=f"scheme of each {what}",
            unit="scheme (bits/weight)",
            tips=tips,
            categories=cats,
            legend=_legend(pal, shown),
            cell_width=cell_width,
        )
    ]
    if any(x.rel_fro is not None for x in at.values()):
        err, tips, _ = _grid_values(layers, cols, at, "rel_fro")
        out.append(
            svg.heatmap(
                rows,
                cols,
                err,
                title="relative Frobenius error ‖W−Ŵ‖/‖W‖",
                unit="rel. error (darker: worse)",
                tips=tips,
                cell_width=cell_width,
            )
        )
    return '<div class="pair">' + "".join(out) + "</div>"


def _grids(r: Report) -> str:
    layers, kinds = r.grid()
    if not layers:
        return '<h2 id="grids">Layers</h2><p class="note">No repeated layers found in the tensor names.</p>'
    at = {(x.layer, x.kind): x for x in r.rows if x.layer is not None}
    out = ['<h2 id="grids">Bits and error across layers</h2>']
    if kinds:
        out.append(_grid_pair(r, layers, kinds, at, "tensor", 40))  # type: ignore[arg-type]
    if not any(x.rel_fro is not None for x in r.rows):
        out.append('<p class="note">No source model: pass --against MODEL to see errors.</p>')
    cells = r.expert_cells()
    for group, experts in r.experts():
        cols = [str(e) for e in experts]
        out.append(f'<h3 class="experts" data-group="{_e(group)}">experts: {_e(group)}</h3>')
        width = 40 if len(cols) <= 16 else 16
        out.append(_grid_pair(r, layers, cols, cells[group], "expert", width))
    return "".join(out)


def _formats(r: Report) -> str:
    fmts = r.formats()
    pal = r.palette()
    items = [(s if s in pal else f"{s} (kept)", w / 1e6) for s, _, w in fmts]
    return '<h2 id="formats">Formats</h2>' + svg.bars(
        items,
        title="weights stored in each format",
        unit="million weights",
        fills=[_scheme_colour(r, s) for s, _, _ in fmts],
    )


def _details(r: Report) -> str:
    if not r.details:
        return ""
    out = ['<h2 id="worst">The tensors with the largest error</h2>']
    for d in r.details:
        out.append(f'<h3>{_e(d.name)} <small>({_e(d.scheme)})</small></h3><div class="pair">')
        out.append(
            svg.histogram(
                d.edges,
                d.counts,
                d.levels,
                title=f"one scale group: {d.group}"[:70],
                xlabel="weight value",
                level_colour=_scheme_colour(r, d.scheme),
            )
        )
        pts = [(c.bits, c.sqnr_db, c.scheme, c.chosen) for c in d.candidates]
        out.append(
            svg.scatter(
                pts,
                title="error vs bits of candidate schemes",
                xlabel="bits per weight (scales included)",
                ylabel="SQNR (dB)",
                chosen_colour=_scheme_colour(r, d.scheme),
            )
        )
        out.append("</div>")
        if d.scale_rules:
            out.append(_rule_table(d.scale_rules, "this tensor"))
    return "".join(out)


def _pct(n: int, of: int) -> str:
    return f"{n:,} ({100 * n / of:.2f}%)" if of else f"{n:,}"


def _rule_table(counts: Sequence[Any], what: str) -> str:
    """The FP4 scale rules' cost (``lowbit.quant.block_clipping``): a bar per rule of the
    blocks that clip, and a table of every count."""
    bars = svg.bars(
        [(c.rule, 100 * c.clipped / c.blocks if c.blocks else 0.0) for c in counts],
        title=f"scale blocks that clip under each FP4 scale rule ({what})"[:90],
        unit="% of blocks",
    )
    head = (
        "<tr><th>rule</th><th>block</th><th>blocks</th><th>clipped blocks</th>"
        "<th>scale underflow</th><th>values flushed to 0</th></tr>"
    )
    body = "".join(
        f"<tr><td>{_e(c.rule)}</td><td>{c.block}</td><td>{c.blocks:,}</td>"
        f"<td>{_pct(c.clipped, c.blocks)}</td>"
        f"<td>{_pct(c.scale_underflow, c.nonzero_blocks)}</td>"
        f"<td>{_pct(c.flushed, c.nonzero_values)}</td></tr>"
        for c in counts
    )
    note = (
        "<p><small>clipped: the block's largest |value| is above 6 × its rounded scale "
        "(saturates); scale underflow: a nonzero block whose scale is below the smallest the "
        "scale format holds (E8M0 2<sup>-127</sup>, E4M3 2<sup>-9</sup>); flushed: nonzero "
        "values that round to 0. Counted on the source weights.</small></p>"
    )
    return f'<div class="pair">{bars}<table>{head}{body}</table></div>{note}'


def _scale_rules(r: Report) -> str:
    if not r.scale_rules:
        return ""
    n = r.scale_rule_tensors
    return (
        '<h2 id="scale-rules">FP4 scale rules</h2>'
        f"<p>What each FP4 scale rule would cost the {n} block-scaled FP4 "
        f"tensor{'s' if n != 1 else ''} of this checkpoint, summed:</p>"
        + _rule_table(r.scale_rules, f"{n} FP4 tensors")
    )


def _sensitivity(r: Report) -> str:
    s = r.sensitivity
    if not s:
        return ""
    tensors = list(dict.fromkeys(e["tensor"] for e in s["entries"]))
    schemes = list(s["schemes"])
    table = {(e["tensor"], e["scheme"]): e for e in s["entries"]}
    chosen = {x.name: x.scheme for x in r.rows}
    key = "damage" if s.get("measure") == "exact" else "proxy"
    values: list[list[float | None]] = []
    tips: list[list[str]] = []
    for t in tensors:
        vr: list[float | None] = []
        tr: list[str] = []
        for sc in schemes:
            e = table.get((t, sc))
            v = None if e is None else (e[key] if e[key] is not None else e["proxy"])
            vr.append(None if v is None else math.log10(max(float(v), 1e-30)))
            mark = " (chosen)" if e is not None and _same_scheme(chosen.get(t), sc) else ""
            tr.append("" if e is None else f"{t} {sc}: {key} {_num(v)}, "
                      f"{e['bits_per_weight']:.3f} bits/weight{mark}")  # fmt: skip
        values.append(vr)
        tips.append(tr)
    out = [
        '<h2 id="sensitivity">Sensitivity and the chosen plan</h2>',
        f'<p class="note">{_e(s["model"])}: {_e(s["metric"])} ({_e(s["measure"])}), '
        f"calibration {_e(s['calibration'])}. Colour: log10 of the damage per tensor and "
        "scheme; the table lists the scheme the checkpoint chose.</p>",
        svg.heatmap(
            tensors,
            schemes,
            values,
            title="damage per tensor and scheme",
            unit=f"log10 {key}",
            tips=tips,
        ),
    ]
    return "".join(out)


def _same_scheme(label: str | None, scheme: str) -> bool:
    if label is None:
        return False
    return label == scheme or (label.split(":")[0] == scheme.split(":")[0] and scheme in label)


_COLUMNS = (
    ("tensor", "name", "str"),
    ("layer", "layer", "num"),
    ("kind", "kind", "str"),
    ("shape", "shape", "str"),
    ("weights", "numel", "num"),
    ("stored", "stored", "str"),
    ("scheme", "scheme", "str"),
    ("rule", "rule", "str"),
    ("bits/weight", "bits", "num"),
    ("source bits", "source_bits", "num"),
    ("rel. error", "rel_fro", "num"),
    ("SQNR dB", "sqnr_db", "num"),
)


def _table(r: Report) -> str:
    head = "".join(f'<th data-type="{t}" data-key="{k}">{_e(h)}</th>' for h, k, t in _COLUMNS)
    body = []
    for x in r.rows:
        cells = []
        for _, k, t in _COLUMNS:
            v = getattr(x, k)
            if t == "num":
                sort = "" if v is None else ("1e999" if v == math.inf else repr(float(v)))
                shown = "-" if v is None else (f"{v:,}" if isinstance(v, int) else _num(v))
                cells.append(f'<td class="n" data-v="{sort}">{_e(shown)}</td>')
            else:
                shown = "×".join(map(str, v)) if k == "shape" else ("" if v is None else str(v))
                cells.append(f'<td data-v="{_e(shown)}">{_e(shown)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        '<h2 id="tensors">Every tensor</h2><p class="note">Click a column header to sort.</p>'
        f'<table class="sortable" id="tensor-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )
