"""The explorer's page: HTML, CSS and the script that calls ``/api/*`` (no network beyond the
local server, no libraries)."""

from __future__ import annotations

import functools
from html import escape

from lowbit.formats.catalog import FORMATS
from lowbit.formats.catalog import format as get_format
from lowbit.formats.explain import MAX_LIST_BITS

__all__ = ["page"]

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:20px auto;max-width:1150px;padding:0 16px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
input,select,button{font:inherit;padding:2px 6px}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 10px;border-bottom:1px solid #eee;text-align:left}
.bits{font-family:ui-monospace,monospace;font-size:15px}
.bit{cursor:pointer;padding:0 2px;border-radius:2px}.bit:hover{outline:1px solid #000}
.bit.sign{background:#cde8f6}.bit.exponent{background:#cdeccd}.bit.mantissa{background:#fbe6b8}
.bit.code{background:#e4ddf4}.gap{display:inline-block;width:6px}
.error{color:#b00020;font-family:ui-monospace,monospace;min-height:1.4em}
.legend span{padding:0 6px;margin-right:8px}.note{color:#666;font-size:12px}
svg{background:#fff;font:11px system-ui,sans-serif}.tick{fill:#555}
.dot{fill:#1f77b4}.dot.b{fill:#d62728}.axis{stroke:#444}
.err-a{fill:none;stroke:#1f77b4;stroke-width:1.3}.err-b{fill:none;stroke:#d62728;stroke-width:1.3}
.value{font-family:ui-monospace,monospace;min-width:180px;max-width:360px;overflow-wrap:anywhere}
"""

_JS = r"""
const $ = (id) => document.getElementById(id);
async function api(path, params) {
  const r = await fetch('/api/' + path + '?' + new URLSearchParams(params));
  const doc = await r.json();
  if (doc.error) throw new Error(doc.error);
  return doc;
}
function bitSpans(fmt, fields, code, bits) {
  const order = ['sign', 'exponent', 'mantissa', 'code'];
  let pos = 0, html = '';
  for (const k of order) {
    const s = fields[k];
    if (!s) continue;
    if (pos) html += ' ';
    for (const ch of s) {
      html += `<span class="bit ${k}" data-format="${fmt}" data-pos="${pos}" ` +
              `data-code="${code}" data-width="${bits}" title="click to flip">${ch}</span>`;
      pos += 1;
    }
  }
  return html;
}
function fmtErr(v) { return (v === null || v === undefined) ? '-' : (typeof v === 'number' ? v.toPrecision(3) : v); }
// only the latest request of each panel draws (an earlier, slower answer is dropped)
const seq = {show: 0, nl: 0, cmp: 0};
async function showValue() {
  const my = ++seq.show;
  const value = $('value').value;
  $('show-error').textContent = '';
  let doc;
  try {
    const params = {value: value, rounding: $('rounding').value};
    if ($('formats').value.trim()) params.formats = $('formats').value;
    doc = await api('show', params);
  } catch (e) {
    if (my !== seq.show) return;
    $('show-error').textContent = e.message; $('show-body').innerHTML = ''; return;
  }
  if (my !== seq.show) return;
  $('show-input').textContent = `${value} read as float64: ${doc.float64_exact}`;
  $('show-body').innerHTML = doc.results.map((r) => {
    if (r.code === null) return `<tr data-format="${r.format}"><td>${r.format}</td><td class="value">-</td><td class="bits">-</td><td>-</td><td>-</td><td>${r.what}</td></tr>`;
    const width = Object.values(r.fields).join('').length;
    return `<tr data-format="${r.format}"><td>${r.format}</td><td class="value">${r.value_exact}</td>` +
      `<td class="bits">${bitSpans(r.format, r.fields, r.code, width)}</td><td class="hex">${r.hex}</td>` +
      `<td>${fmtErr(r.rel_error)}</td><td class="what">${r.what}</td></tr>`;
  }).join('');
}
async function flip(el) {
  const width = +el.dataset.width, pos = +el.dataset.pos;
  const code = BigInt(el.dataset.code) ^ (1n << BigInt(width - 1 - pos));
  const fmt = el.dataset.format;
  $('show-error').textContent = '';
  let d;
  try { d = await api('decode', {format: fmt, code: code.toString()}); }
  catch (e) { $('show-error').textContent = e.message; return; }
  const row = el.closest('tr');
  row.querySelector('.value').textContent = d.value_exact;
  row.querySelector('.bits').innerHTML = bitSpans(fmt, d.fields, d.code, width);
  row.querySelector('.hex').textContent = d.hex;
  row.querySelector('.what').textContent = `flipped: ${d.class}, ${d.formula}`;
}
function axisTicks(lo, hi, n) {
  const out = []; for (let k = 0; k <= n; k++) out.push(lo + (hi - lo) * k / n); return out;
}
function short(v) { return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(1) : +v.toPrecision(3) + ''; }
async function numberLine() {
  const my = ++seq.nl;
  $('nl-error').textContent = '';
  let doc;
  try { doc = await api('values', {format: $('nl-format').value}); }
  catch (e) { if (my === seq.nl) { $('nl-error').textContent = e.message; $('numberline').innerHTML = ''; } return; }
  if (my !== seq.nl) return;
  const log = $('nl-log').checked;
  let vals = [...new Set(doc.values.map((d) => d.value))];
  if (log) vals = vals.filter((v) => v > 0);
  const W = 1000, L = 40, R = 20, y = 60;
  const f = log ? Math.log2 : (v) => v;
  const lo = Math.min(...vals.map(f)), hi = Math.max(...vals.map(f));
  const x = (v) => L + (f(v) - lo) / ((hi - lo) || 1) * (W - L - R);
  let s = `<line class="axis" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/>`;
  const drawn = new Set();  // one dot per distinct value: -0 and +0 share one
  for (const d of doc.values) {
    if ((log && !(d.value > 0)) || drawn.has(d.value)) continue;
    drawn.add(d.value);
    s += `<circle class="dot" cx="${x(d.value).toFixed(2)}" cy="${y}" r="4"><title>${d.hex} = ${d.value_exact}</title></circle>`;
  }
  for (const t of axisTicks(lo, hi, 8)) {
    const xv = L + (t - lo) / ((hi - lo) || 1) * (W - L - R);
    s += `<text class="tick" x="${xv}" y="${y + 22}" text-anchor="middle">${log ? '2^' + short(t) : short(t)}</text>`;
  }
  s += `<text x="${W / 2}" y="16" text-anchor="middle" font-weight="600">${doc.format}: ${doc.distinct_values} distinct finite values (${log ? 'positive values, log2 scale' : 'linear scale'})</text>`;
  s += `<text x="${W / 2}" y="${y + 40}" text-anchor="middle">value${log ? ' (log2 axis)' : ''}</text>`;
  $('numberline').innerHTML = s;
}
async function compare() {
  const my = ++seq.cmp;
  $('cmp-error').textContent = '';
  $('cmp-table').innerHTML = '';
  const a = $('cmp-a').value, b = $('cmp-b').value;
  let doc;
  try { doc = await api('range', {formats: a + ',' + b, lo: $('cmp-lo').value, hi: $('cmp-hi').value, n: 301}); }
  catch (e) { if (my === seq.cmp) { $('cmp-error').textContent = e.message; $('cmp-chart').innerHTML = ''; } return; }
  if (my !== seq.cmp) return;
  const W = 1000, H = 300, L = 60, R = 20, T = 30, B = 60;
  const xs = doc.x, lo = xs[0], hi = xs[xs.length - 1];
  const X = (v) => L + (v - lo) / (hi - lo) * (W - L - R);
  const errs = doc.results.map((rs) => rs.map((r) => (r.abs_error === null || typeof r.abs_error !== 'number') ? NaN : r.abs_error));
  const emax = Math.max(...errs.flat().filter(Number.isFinite), 1e-300);
  const Y = (e) => H - B - e / emax * (H - B - T - 40);
  let s = `<line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/><line class="axis" x1="${L}" x2="${L}" y1="${T}" y2="${H - B}"/>`;
  ['a', 'b'].forEach((cls, j) => {
    const d = errs.map((e, k) => `${k ? 'L' : 'M'}${X(xs[k]).toFixed(1)},${Y(Number.isFinite(e[j]) ? e[j] : 0).toFixed(1)}`).join(' ');
    s += `<path class="err-${cls}" d="${d}"/>`;
    const seen = new Set();
    doc.results.forEach((rs) => { const v = rs[j].value; if (typeof v === 'number' && v >= lo && v <= hi) seen.add(v); });
    for (const v of seen) s += `<circle class="dot ${cls}" cx="${X(v).toFixed(1)}" cy="${T + 8 + 14 * j}" r="3"><title>${doc.formats[j]}: ${v}</title></circle>`;
  });
  for (const t of axisTicks(lo, hi, 8)) s += `<text class="tick" x="${X(t)}" y="${H - B + 16}" text-anchor="middle">${short(t)}</text>`;
  s += `<text class="tick" x="${L - 4}" y="${Y(emax) + 4}" text-anchor="end">${short(emax)}</text><text class="tick" x="${L - 4}" y="${H - B}" text-anchor="end">0</text>`;
  s += `<text x="${(L + W - R) / 2}" y="${H - 20}" text-anchor="middle">input value x</text>`;
  s += `<text x="14" y="${(T + H - B) / 2}" transform="rotate(-90 14 ${(T + H - B) / 2})" text-anchor="middle">|x − round(x)|</text>`;
  s += `<text x="${W / 2}" y="14" text-anchor="middle" font-weight="600">grid points (dots, top) and rounding error of ${doc.formats[0]} (blue) and ${doc.formats[1]} (red)</text>`;
  $('cmp-chart').innerHTML = s;
  try {
    const c = await api('compare', {formats: `${a}:t,${b}:t`, data: 'normal', size: 65536});
    if (my !== seq.cmp) return;
    $('cmp-table').innerHTML = '<tr><th>scheme (one scale, N(0,1) data)</th><th>bits/value</th><th>SQNR dB</th></tr>' +
      c.results.map((r) => `<tr><td>${r.scheme}</td><td>${r.bits_per_value.toFixed(3)}</td><td>${(+r.sqnr_db).toFixed(2)}</td></tr>`).join('');
  } catch (e) { $('cmp-table').innerHTML = `<tr><td class="error">${e.message}</td></tr>`; }
}
document.addEventListener('click', (e) => { if (e.target.classList.contains('bit')) flip(e.target); });
$('value').addEventListener('change', showValue);
$('show-go').addEventListener('click', showValue);
$('nl-format').addEventListener('change', numberLine);
$('nl-log').addEventListener('change', numberLine);
$('cmp-go').addEventListener('click', compare);
showValue(); numberLine(); compare();
"""


@functools.cache
def page() -> str:
    """The explorer's HTML page (formats of at most 8 bits fill the number-line menu)."""

    small = [n for n in FORMATS if get_format(n).bits <= MAX_LIST_BITS]
    options = "".join(
        f'<option value="{escape(n)}"{" selected" if n == "float4_e2m1fn" else ""}>{escape(n)}</option>'
        for n in small
    )
    return f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<title>lowbit explore</title><style>{_CSS}</style></head><body>
<h1>lowbit explore: number formats, bit by bit</h1>
<h2>A value in every format</h2>
<p><label>value <input id="value" value="0.3952" size="18"></label>
<label>formats <input id="formats" value="" size="30" placeholder="the default list; or all, or a,b,..." title="comma-separated names, or all"></label>
<label>rounding <select id="rounding"><option>nearest_even</option><option>nearest_away</option>
<option>toward_zero</option><option>toward_positive</option><option>toward_negative</option></select></label>
<button id="show-go">show</button></p>
<p class="legend"><span class="bit sign">sign</span><span class="bit exponent">exponent</span>
<span class="bit mantissa">mantissa</span><span class="bit code">integer / table index</span>
click a bit to flip it</p>
<div id="show-error" class="error"></div><div id="show-input" class="note"></div>
<table id="show-table"><thead><tr><th>format</th><th>value</th><th>bits</th><th>code</th>
<th>rel. error</th><th>what happened</th></tr></thead><tbody id="show-body"></tbody></table>
<h2>Every value of a small format on a number line</h2>
<p><label>format <select id="nl-format">{options}</select></label>
<label><input type="checkbox" id="nl-log"> log scale (positive values)</label></p>
<div id="nl-error" class="error"></div>
<svg id="numberline" viewBox="0 0 1000 110" width="1000" height="110"></svg>
<h2>Two formats over a range</h2>
<p><label>format A <input id="cmp-a" value="float8_e4m3fn" size="14"></label>
<label>format B <input id="cmp-b" value="float8_e5m2" size="14"></label>
<label>from <input id="cmp-lo" value="0.5" size="6"></label>
<label>to <input id="cmp-hi" value="4" size="6"></label> <button id="cmp-go">compare</button></p>
<div id="cmp-error" class="error"></div>
<svg id="cmp-chart" viewBox="0 0 1000 300" width="1000" height="300"></svg>
<table id="cmp-table"></table>
<p class="note">Served by lowbit on 127.0.0.1; every number comes from the same functions as
<code>lowbit show/decode/values/compare --json</code>.</p>
<script>{_JS}</script></body></html>"""
