"""lowbit's own checkpoint: packed codes and scales (:mod:`.checkpoint`), the manifest and its
schema (:mod:`.manifest`, :mod:`.manifest_schema`).

The checkpoint's names load from here on first use, as they did when this was one module.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    module = importlib.import_module(f"{__name__}.checkpoint")
    if name in module.__all__:
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
