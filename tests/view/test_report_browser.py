"""``lowbit report``'s page in a real headless Chromium: every figure drawn, sorting works,
no console errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from browser_helpers import chromium_page, screenshot

pytest.importorskip("transformers")
from lowbit.cli import main
from tiny_models import save_hf_folder, tiny_llama


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    src = save_hf_folder(tiny_llama(seed=1), root / "src")
    q = root / "q"
    assert main(["quantize", str(src), "--to", "int4", "--group", "32", "--out", str(q)]) == 0
    out = root / "report.html"
    assert main(["report", str(q), "--out", str(out)]) == 0
    return out


@pytest.fixture
def page():
    yield from chromium_page()


def test_every_figure_renders(report_html: Path, page) -> None:
    """Both grids have a rect per tensor in a layer, each histogram a line per level, each
    frontier a path and a circle per candidate, the formats chart a bar per scheme."""
    pg, errors = page
    pg.goto(report_html.as_uri())
    heat = pg.locator("svg[data-chart=heatmap]")
    assert heat.count() == 2
    for k in range(2):  # 2 layers x 9 tensor kinds of the tiny llama
        assert heat.nth(k).locator("rect.cell").count() == 18
    hists = pg.locator("svg[data-chart=histogram]")
    assert hists.count() == 3
    for k in range(3):
        assert hists.nth(k).locator("line.level:not(.key)").count() == 16  # int4: -8..7 scaled
        assert hists.nth(k).locator("rect.bar:not(.key)").count() >= 10
    scat = pg.locator("svg[data-chart=scatter]")
    assert scat.count() == 3
    for k in range(3):
        assert scat.nth(k).locator("path.frontier:not(.key)").count() >= 1
        assert scat.nth(k).locator("circle.point:not(.key)").count() >= 5
        assert scat.nth(k).locator("circle.point.chosen:not(.key)").count() == 1
    assert pg.locator("svg[data-chart=bars] rect.hbar").count() == 2  # int4:g32 and F32
    for k in range(pg.locator("svg.chart").count()):  # drawn: a real box on the page
        box = pg.locator("svg.chart").nth(k).bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 50
    pg.locator("rect.cell").first.hover()
    assert pg.locator("#tip").is_visible() and "bits/weight" in pg.locator("#tip").inner_text()
    screenshot(pg, "report.png")
    screenshot(pg, "report-full.png", full_page=True)
    assert errors == []


def test_table_sorts_on_header_click(report_html: Path, page) -> None:
    """Clicking "SQNR dB" sorts ascending (tensors without an error last), clicking again
    descending; clicking "tensor" sorts by name."""
    pg, errors = page
    pg.goto(report_html.as_uri())
    table = pg.locator("#tensor-table")
    n = table.locator("tbody tr").count()
    assert n == 21

    def column(i: int) -> list[str]:
        return table.locator(f"tbody tr td:nth-child({i})").evaluate_all(
            "cells => cells.map(c => c.getAttribute('data-v'))"
        )

    table.locator("th", has_text="SQNR dB").click()
    vals = [float(v) for v in column(12) if v]
    assert vals == sorted(vals) and len(vals) == n
    table.locator("th", has_text="SQNR dB").click()
    vals = [float(v) for v in column(12) if v]
    assert vals == sorted(vals, reverse=True)
    table.locator("th", has_text="tensor").first.click()
    names = column(1)
    assert names == sorted(names, key=lambda s: s) or names == sorted(names, key=str.lower)
    screenshot(pg, "report-table-sorted.png")
    assert errors == []
