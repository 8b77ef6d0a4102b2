"""The report's pictures in a real headless Chromium: on a mixed plan and on a mixture-of-
experts checkpoint, the legend names every scheme, the columns follow the block, and what is
drawn has one colour per scheme (computed styles, as the browser paints them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from browser_helpers import chromium_page, screenshot

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from report_models import (
    LLAMA_ORDER,
    MIXED_SCHEMES,
    MOE_EXPERTS,
    MOE_LAYERS,
    mixed_llama,
    moe_checkpoint,
)

from lowbit.cli import main
from lowbit.view.palette import KEPT, KEPT_COLOUR

# what each drawn cell, swatch and bar is: its key and its computed fill
_CELLS = "els => els.map(e => [e.getAttribute('data-key'), getComputedStyle(e).fill])"
_SWATCHES = (
    "els => els.map(e => [e.getAttribute('data-key'), "
    "getComputedStyle(e.querySelector('rect')).fill, e.querySelector('text').textContent])"
)


def _texts(loc) -> list[str]:
    """The text of SVG text elements (Playwright's inner_text is HTML's only)."""
    return loc.evaluate_all("els => els.map(e => e.textContent)")


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colours")
    out = {}
    for name, make in (("mixed", mixed_llama), ("moe", moe_checkpoint)):
        q = make(root / name)
        out[name] = root / f"{name}.html"
        assert main(["report", str(q), "--out", str(out[name]), "--worst", "1"]) == 0
    return out


@pytest.fixture
def page():
    yield from chromium_page()


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _check_grid(grid, want_keys: set[str]) -> dict[str, str]:
    """One fill per key and one key per fill over the grid's cells; the legend lists exactly
    the keys drawn, each swatch in its cells' colour, every scheme by name. Returns key ->
    fill."""
    cells = grid.locator("rect.cell").evaluate_all(_CELLS)
    fill_of: dict[str, set[str]] = {}
    for key, fill in cells:
        fill_of.setdefault(key, set()).add(fill)
    assert set(fill_of) == want_keys
    assert all(len(f) == 1 for f in fill_of.values())  # a scheme has one colour
    fills = {k: f.pop() for k, f in fill_of.items()}
    assert len(set(fills.values())) == len(fills)  # two schemes never share one
    swatches = grid.locator("g.swatch").evaluate_all(_SWATCHES)
    assert [k for k, _, _ in swatches] == [k for k, _, _ in swatches if k in fills]
    assert {k for k, _, _ in swatches} == set(fills)
    for key, fill, label in swatches:
        assert fill == fills[key]
        assert label == "kept as stored" if key == KEPT else label.startswith(key + " (")
    if KEPT in fills:
        assert fills[KEPT] == _rgb(KEPT_COLOUR) and swatches[-1][0] == KEPT
    return fills


def test_mixed_plan_legend_order_colours(pages: dict[str, Path], page) -> None:
    """The tiny Llama under int4/int5/int6/int8 rules: columns q, k, v, o, gate, up, down,
    norms; seven schemes and kept, each its own colour in the grid, the legend (cheapest
    first), the formats bars and the worst tensor's chosen point."""
    pg, errors = page
    pg.goto(pages["mixed"].as_uri())
    grid = pg.locator("svg[data-chart=heatmap]").first
    cols = _texts(grid.locator("text.col"))
    assert cols == LLAMA_ORDER
    fills = _check_grid(grid, set(MIXED_SCHEMES.values()) | {KEPT})
    # the first column (q_proj, int4:g32) is the scheme's colour in every layer
    cells = grid.locator("rect.cell").evaluate_all(_CELLS)
    assert cells[0] == ["int4:g32:fp32", fills["int4:g32:fp32"]]
    bars = pg.locator("svg[data-chart=bars] rect.hbar").evaluate_all(_CELLS)
    for key, fill in bars:
        assert fill == fills.get(key, fills[KEPT])  # F32 (kept): kept's grey
    chosen = pg.locator("svg[data-chart=scatter] circle.point.chosen:not(.key)")
    scheme = pg.locator("#worst + h3 small").inner_text().strip("()")
    assert chosen.evaluate("e => getComputedStyle(e).fill") == fills[scheme]
    grid.scroll_into_view_if_needed()
    screenshot(pg, "report-mixed.png")
    assert errors == []


def test_moe_expert_groups(pages: dict[str, Path], page) -> None:
    """The Mixtral-named checkpoint: the main grid runs attention, router, norms; then one
    grid per expert kind in block order (w1 gate, w3 up, w2 down), layers x experts, with
    the same colours for the same schemes as the main grid."""
    pg, errors = page
    pg.goto(pages["moe"].as_uri())
    heads = pg.locator("h3.experts").evaluate_all("els => els.map(e => e.dataset.group)")
    assert heads == [f"block_sparse_moe.experts.*.{w}" for w in ("w1", "w3", "w2")]
    grids = pg.locator("svg[data-chart=heatmap]:has(g.swatch)")
    assert grids.count() == 4  # the main grid and three expert kinds
    main_grid = grids.nth(0)
    assert _texts(main_grid.locator("text.col")) == [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "block_sparse_moe.gate", "input_layernorm", "post_attention_layernorm",
    ]  # fmt: skip
    fills = _check_grid(main_grid, {"int6:g32:fp32", KEPT})
    for k, scheme in enumerate(("int4:g32:fp32", "int4:g32:fp32", "int8:ch:fp32"), start=1):
        g = grids.nth(k)
        assert _texts(g.locator("text.col")) == [str(e) for e in range(MOE_EXPERTS)]
        assert g.locator("rect.cell").count() == MOE_LAYERS * MOE_EXPERTS
        got = _check_grid(g, {scheme})
        assert got[scheme] not in fills.values()  # int4/int8 differ from int6 and kept
    screenshot(pg, "report-moe-full.png", full_page=True)
    assert errors == []
