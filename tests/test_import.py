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
