"""The CPU this process runs on: its model name and feature flags, read once.

Both keys of per-machine choices (``lowbit.codecs._path_choice``) and the compute-precision
choice of model work (``lowbit.models._compute``) read the CPU from here. On Linux the
source is ``/proc/cpuinfo`` (x86 ``flags``, ARM ``Features``); elsewhere the model is
``platform.processor()`` and the flags are empty, so every feature test answers "no".
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

__all__ = ["cpu_flags", "cpu_model"]


@cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = "", frozenset[str]()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("model name", "Model") and not model:
            model = value
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return model or platform.processor() or platform.machine() or "unknown", flags


def cpu_model() -> str:
    """The CPU's model name (``"AMD EPYC"``), or the machine type where none can be read."""
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as ``/proc/cpuinfo`` spells them (``avx512_bf16``,
    ``amx_bf16``, ``asimd``); empty where they cannot be read."""
    return _cpuinfo()[1]
