"""Timing helpers shared by the benchmark modules (benchmarks/ is on sys.path for them)."""

from __future__ import annotations

import time
from typing import Any


def best(fn: Any, repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` calls of ``fn``, after one warm-up call
    (caches, lazy tables, numba compilation)."""
    fn()
    fastest = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - t0)
    return fastest
