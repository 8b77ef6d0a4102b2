"""The CPU a benchmark ran on: model, cores and vector extensions (benchmarks/ is on
sys.path for the bench modules; run.py prints this beside every table)."""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

# Vector extensions that decide codec speed, as /proc/cpuinfo spells them (x86 "flags",
# ARM "Features")
_VECTOR = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "asimd", "asimdhp", "sve", "sve2",
)  # fmt: skip


@cache
def cpu() -> str:
    """One line: CPU model, cores usable by this process, and its vector extensions."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name" and not model:
                model = value
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    vector = [f for f in _VECTOR if f in flags]
    if "avx2" in flags and "avx512f" not in flags:
        vector.append("no AVX-512")
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    return (
        f"{model}, {usable} of {os.cpu_count()} cores usable; vector extensions: "
        f"{', '.join(vector) if vector else 'unknown (no /proc/cpuinfo)'}"
    )
