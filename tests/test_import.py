"""``import lowbit`` stays light: numpy and ml_dtypes only."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_load_heavy_modules() -> None:
    """torch, transformers, matplotlib, safetensors and numba stay unloaded on import."""
    code = (
        "import sys, lowbit; lowbit.format('e4m3').encode([1.0]);"
        "heavy = [m for m in ('torch', 'transformers', 'matplotlib', 'safetensors', 'gguf')"
        " if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_import_does_not_load_numba() -> None:
    """numba (about half a second to import) loads with the first compiled kernel, not before."""
    code = "import sys, lowbit; print(any(m in sys.modules for m in ('numba', 'llvmlite')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_version_matches_pyproject() -> None:
    """lowbit.__version__ (lowbit/_version.py) is pyproject.toml's version."""
    import re
    from pathlib import Path

    import lowbit

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version = "([^"]+)"', text, re.MULTILINE)
    assert match is not None and lowbit.__version__ == match.group(1)
