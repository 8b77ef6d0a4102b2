"""What a model costs: model specs from configs and headers, the hardware catalog, and memory
and speed estimates per precision. Pure arithmetic: no torch, no tensor data.

- :mod:`~lowbit.planning.modelspec`: named tensor shapes and attention dimensions.
- :mod:`~lowbit.planning.archs`: a :class:`ModelSpec` from a config, a checkpoint header or a
  parameter count.
- :mod:`~lowbit.planning.hardware`: the device catalog (``data/hardware.json``).
- :mod:`~lowbit.planning.estimate`: :func:`plan`, weights + KV cache + speed bounds.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"plan": "lowbit.planning.estimate"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lowbit.planning' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
