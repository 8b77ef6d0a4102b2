"""``lowbit explore`` in a real headless Chromium: a typed value in every format, a flipped
bit, the number line, a bad value's one-line error, no console errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from browser_helpers import chromium_page, screenshot

from lowbit.cli import main
from lowbit.cli._explore_server import serve_in_thread


@pytest.fixture(scope="module")
def url():
    server, address = serve_in_thread(0)
    try:
        yield address
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def page():
    yield from chromium_page()


def _row(pg, fmt: str):
    return pg.locator(f'#show-body tr[data-format="{fmt}"]')


def test_value_in_every_format_and_a_bit_flip(url: str, page) -> None:
    """0.3952 shows float8_e4m3fn = 0.40625 = 0 0101 101 (sign, exponent, mantissa coloured);
    clicking the last mantissa bit gives code 0x2c = 0.375."""
    pg, errors = page
    pg.goto(url)
    pg.fill("#value", "0.3952")
    pg.click("#show-go")
    row = _row(pg, "float8_e4m3fn")
    row.wait_for()
    assert row.locator(".value").inner_text() == "0.40625"
    spans = row.locator(".bit")
    assert "".join(spans.all_inner_texts()) == "00101101"
    kinds = spans.evaluate_all("s => s.map(e => e.classList[1])")
    assert kinds == ["sign"] + ["exponent"] * 4 + ["mantissa"] * 3
    assert row.locator(".bits").inner_text().split() == ["0", "0101", "101"]
    assert _row(pg, "bfloat16").count() == 1 and _row(pg, "nf4").count() == 1
    screenshot(pg, "explore.png")
    spans.nth(7).click()
    pg.wait_for_function(
        """() => document.querySelector('#show-body tr[data-format="float8_e4m3fn"] .value')
                 .textContent === '0.375'"""
    )
    assert row.locator(".hex").inner_text() == "0x2c"
    assert row.locator(".bits").inner_text().split() == ["0", "0101", "100"]
    spans = row.locator(".bit")
    spans.nth(0).click()  # the sign bit
    pg.wait_for_function(
        """() => document.querySelector('#show-body tr[data-format="float8_e4m3fn"] .value')
                 .textContent === '-0.375'"""
    )
    screenshot(pg, "explore-flipped.png")
    assert errors == []


def test_number_line_linear_and_log(url: str, page) -> None:
    """fp4's 15 distinct values are 15 dots on the linear line, its 7 positive ones on the
    log line; e4m3 has 253 distinct finite values."""
    pg, errors = page
    pg.goto(url)
    pg.select_option("#nl-format", "float4_e2m1fn")
    pg.wait_for_function("() => document.querySelectorAll('#numberline circle.dot').length === 15")
    pg.check("#nl-log")
    pg.wait_for_function("() => document.querySelectorAll('#numberline circle.dot').length === 7")
    pg.uncheck("#nl-log")
    pg.select_option("#nl-format", "float8_e4m3fn")
    pg.wait_for_function("() => document.querySelectorAll('#numberline circle.dot').length > 200")
    screenshot(pg, "explore-numberline.png")
    assert errors == []


def test_compare_two_formats(url: str, page) -> None:
    """The comparison draws both rounding-error curves and both grids in the range, and the
    table of `lowbit compare` for the two formats."""
    pg, errors = page
    pg.goto(url)
    pg.fill("#cmp-a", "fp4")
    pg.fill("#cmp-b", "e2m3")
    pg.fill("#cmp-lo", "0")
    pg.fill("#cmp-hi", "6")
    pg.click("#cmp-go")
    pg.wait_for_function("() => document.querySelector('#cmp-table').textContent.includes('fp4')")
    assert pg.locator("#cmp-chart path.err-a").count() == 1
    assert pg.locator("#cmp-chart path.err-b").count() == 1
    assert pg.locator("#cmp-chart circle.dot.a").count() == 8  # fp4's values in 0..6
    assert pg.locator("#cmp-chart circle.dot.b").count() > 8
    table = pg.locator("#cmp-table").inner_text()
    assert "fp4:t:fp32" in table and "e2m3:t:fp32" in table
    screenshot(pg, "explore-compare.png", full_page=True)
    assert errors == []


def test_bad_value_shows_the_cli_line(url: str, page, capsys: pytest.CaptureFixture) -> None:
    """A value that is no number shows exactly the line `lowbit show` prints, and no
    console error (the page handles the 400)."""
    assert main(["show", "abc"]) == 2
    cli_line = capsys.readouterr().err.strip()
    pg, errors = page
    pg.goto(url)
    pg.fill("#value", "abc")
    pg.click("#show-go")
    pg.wait_for_function("() => document.querySelector('#show-error').textContent !== ''")
    assert pg.locator("#show-error").inner_text() == cli_line
    screenshot(pg, "explore-error.png")
    assert [e for e in errors if "400" not in e] == []
