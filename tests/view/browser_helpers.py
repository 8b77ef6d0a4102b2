"""Shared by the browser tests: the system Chromium driven by Playwright, or a skip that says
what is missing. Never downloads a browser (no ``playwright install``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: Screenshots of every browser test run land here (git-ignored with the rest of out/).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "out" / "test-screenshots"


def chromium_page() -> Iterator[tuple[Any, list[str]]]:
    """Yield ``(page, console errors)``: a fresh page of a headless system Chromium whose
    console errors and uncaught exceptions are collected."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no chromium on PATH: `make install` adds Debian's package (apt-get)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install 'lowbit[test]'")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page, errors
        finally:
            browser.close()


def screenshot(page: Any, name: str, *, full_page: bool = False) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), full_page=full_page)
    return path
