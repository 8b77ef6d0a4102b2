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


def child_env(src: Any) -> dict[str, str]:
    """Environment for timing lowbit in child processes as an installed copy runs: ``src``
    (this checkout's ``src``) first on the path, one thread (OMP_NUM_THREADS=1), and
    Python's bytecode caches used and written. A shell with PYTHONDONTWRITEBYTECODE=1
    would otherwise make every process compile lowbit's sources again (0.7 s of CPU for
    ``lowbit quantize``), which an installed package never does. Call
    ``compile_sources(src, env)`` once first, as ``pip install`` does."""
    import os

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    return env


def compile_sources(src: Any, env: dict[str, str]) -> None:
    """Write the bytecode cache of ``src``'s lowbit package (what ``pip install`` does)."""
    import subprocess
    import sys
    from pathlib import Path

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(src) / "lowbit")],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
