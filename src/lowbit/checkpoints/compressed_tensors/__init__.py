"""The format llm-compressor writes and vLLM serves: its config (:mod:`.config`), packed tensors
(:mod:`.tensor`, :mod:`.fp4`), the layout of fused modules (:mod:`.layout`), transforms
(:mod:`.transforms`), the reader (:mod:`.reader`) and the writer (:mod:`.writer`).

The writer's names (its ``__all__``) load from here on first use, as they did when this was one module.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    module = importlib.import_module(f"{__name__}.writer")
    if name in module.__all__:
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
