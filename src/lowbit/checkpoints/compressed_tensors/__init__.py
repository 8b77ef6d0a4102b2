"""The format llm-compressor writes and vLLM serves: its config (:mod:`.config`), packed tensors
(:mod:`.tensor`, :mod:`.fp4`), the layout of fused modules (:mod:`.layout`), transforms
(:mod:`.transforms`), the reader (:mod:`.reader`) and the writer (:mod:`.writer`).

The writer's names load from here on first use, as they did when this was one module.
"""

from __future__ import annotations

import importlib
from typing import Any

_WRITER = (
    "CT_FORMAT_VERSION",
    "CTTensor",
    "from_quantized",
    "pack_int32",
    "quantization_config",
    "write_compressed_tensors",
)
__all__ = list(_WRITER)


def __getattr__(name: str) -> Any:
    if name in _WRITER:
        return getattr(importlib.import_module(f"{__name__}.writer"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
