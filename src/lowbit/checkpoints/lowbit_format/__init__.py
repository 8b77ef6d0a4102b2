"""lowbit's own checkpoint: packed codes and scales (:mod:`.checkpoint`), the manifest and its
schema (:mod:`.manifest`, :mod:`.manifest_schema`).

The checkpoint's names load from here on first use, as they did when this was one module.
"""

from __future__ import annotations

import importlib
from typing import Any

_CHECKPOINT = (
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST",
    "LowbitCheckpoint",
    "Unit",
    "is_lowbit_checkpoint",
    "write_lowbit_checkpoint",
)
__all__ = list(_CHECKPOINT)


def __getattr__(name: str) -> Any:
    if name in _CHECKPOINT:
        return getattr(importlib.import_module(f"{__name__}.checkpoint"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
