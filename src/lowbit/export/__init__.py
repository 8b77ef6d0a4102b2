"""Writers for checkpoints other tools load: llama.cpp's GGUF and compressed-tensors (vLLM).

- :mod:`lowbit.export.gguf_q`: Q8_0 / Q4_0 block quantizers, numpy only.
- :mod:`lowbit.export.gguf_writer`: :func:`write_gguf`, :class:`GGUFTensor`,
  :func:`gguf_from_quantized` (writing needs the ``gguf`` package).
- :mod:`lowbit.export.compressed_tensors`: :func:`write_compressed_tensors`,
  :class:`CTTensor`, :func:`from_quantized`.

The names load on first use, so ``import lowbit.export`` stays light. See docs/export.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "write_gguf": "lowbit.export.gguf_writer",
    "GGUFTensor": "lowbit.export.gguf_writer",
    "gguf_from_quantized": "lowbit.export.gguf_writer",
    "write_compressed_tensors": "lowbit.export.compressed_tensors",
    "CTTensor": "lowbit.export.compressed_tensors",
    "from_quantized": "lowbit.export.compressed_tensors",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lowbit.export' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
