"""docs/architecture.md matches the tree: every module is listed, every listed module exists, and
a module past 450 lines has a sentence there saying why."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
LONG = 450


def _modules() -> set[str]:
    src = ROOT / "src"
    return {
        p.relative_to(src).as_posix()
        for p in (src / "lowbit").rglob("*.py")
        if "__pycache__" not in p.parts
    }


def _named() -> set[str]:
    return set(re.findall(r"`(lowbit/[\w/]+\.py)`", DOC.read_text()))


def test_every_module_is_listed() -> None:
    """Each module of src/lowbit has its line in docs/architecture.md."""
    missing = sorted(_modules() - _named())
    assert not missing, f"not in docs/architecture.md: {missing}"


def test_every_listed_module_exists() -> None:
    """The doc names no module that is gone."""
    stale = sorted(_named() - _modules())
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_long_modules_are_explained() -> None:
    """A module over 450 lines is named in the doc's section on long modules."""
    text = DOC.read_text()
    section = text.split("## Long modules", 1)[1] if "## Long modules" in text else ""
    src = ROOT / "src"
    long = [m for m in _modules() if len((src / m).read_text().splitlines()) > LONG]
    unexplained = sorted(m for m in long if f"`{m}`" not in section)
    assert not unexplained, (
        f"over {LONG} lines with no sentence under '## Long modules': {unexplained}"
    )
