"""Take the README's screenshots: ``python docs/img/screenshots.py REPORT.html [--report-only]``.

Drives the system Chromium with Playwright (never a downloaded browser): the grids of the
report page (docs/img/report.png) and the explorer after typing 0.3952 (docs/img/explore.png;
not with ``--report-only``). The README's report is SmolLM2 under docs/img/smollm2-mixed.yaml:

    lowbit quantize smollm2 --plan docs/img/smollm2-mixed.yaml --to int4:g128 --out smol-mixed
    lowbit report smol-mixed --out smol-mixed.html
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

from lowbit.cli._explore_server import serve_in_thread

HERE = Path(__file__).parent


def main(report: str, report_only: bool = False) -> None:
    server, url = serve_in_thread(0)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=shutil.which("chromium"), headless=True, args=["--no-sandbox"]
            )
            page = browser.new_page(viewport={"width": 1240, "height": 760})
            page.goto(Path(report).resolve().as_uri())
            page.locator("#grids").scroll_into_view_if_needed()
            page.evaluate("window.scrollTo(0, document.querySelector('#grids').offsetTop - 10)")
            page.screenshot(path=str(HERE / "report.png"))
            if report_only:
                browser.close()
                return
            page.goto(url)
            page.fill("#value", "0.3952")
            page.fill("#formats", "bf16,fp16,e4m3,e5m2,e2m3,e3m2,fp4,nf4,int4")
            page.click("#show-go")
            page.locator('#show-body tr[data-format="nf4"]').wait_for()
            page.wait_for_function(
                "() => document.querySelectorAll('#numberline circle.dot').length === 15"
            )
            page.screenshot(path=str(HERE / "explore.png"))
            browser.close()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], "--report-only" in sys.argv[2:])
