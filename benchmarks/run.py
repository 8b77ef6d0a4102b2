"""Run every benchmarks/bench_*.py and write docs/benchmarks.md from what they measured.

Each bench module defines ``run(quick: bool) -> str`` returning a markdown section
(heading, table, notes). ``--quick`` uses smaller sizes (a smoke test, not for the docs);
``--only NAME`` runs one module; ``--no-write`` prints instead of writing the docs.
Every section gets the CPU line (model, usable cores, vector extensions) under its
heading, so each table says what it was measured on.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from _machine import cpu

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "benchmarks.md"
# docs/benchmarks.md from this line on is measured by hand (runs too long or too special for
# `make bench`); a rewrite keeps it, under the sections the benchmarks generate
HAND = "<!-- measured by hand below this line: make bench keeps it -->"


def _hand_part() -> str:
    """The hand-measured tail of the current docs/benchmarks.md (from HAND), or ''."""
    try:
        text = DOC.read_text()
    except OSError:
        return ""
    at = text.find(HAND)
    return "" if at < 0 else "\n" + text[at:].rstrip() + "\n"


def machine() -> str:
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    versions = []
    for pkg in ("numpy", "ml_dtypes", "numba", "torch", "gfloat", "safetensors", "gguf"):
        try:
            versions.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip()
    except OSError:
        commit = "?"
    return (
        f"- Machine: {cpu()}{mem}; {platform.system()} {platform.release()}\n"
        f"- Python {platform.python_version()}; {', '.join(versions)}\n"
        f"- lowbit commit {commit}; run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )


def _with_cpu(section: str) -> str:
    """The section with the CPU line under each of its ``##`` headings."""
    lines = []
    for line in section.splitlines():
        lines.append(line)
        if line.startswith("## "):
            lines += ["", f"CPU: {cpu()}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    sections = []
    for path in sorted(HERE.glob("bench_*.py")):
        if args.only and args.only not in path.stem:
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        print(f"== {path.name}", file=sys.stderr, flush=True)
        sections.append(_with_cpu(mod.run(quick=args.quick)))
    text = (
        "# Benchmarks\n\n"
        "Written by `make bench` (benchmarks/run.py) from the run below; every ratio is\n"
        "against a peer measured in the same run, on the same data, single process.\n\n"
        + machine()
        + "\n"
        + "\n\n".join(sections)
        + "\n"
    )
    if args.no_write or args.quick or args.only:
        print(text)
    else:
        DOC.write_text(text + _hand_part())
        print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
