"""How many torch threads an evaluation uses, and the context that sets them.

:func:`default_threads` reads the CPU affinity and, under OpenMP's spinning wait policy, the
cores idle as the loop starts (``/proc/stat``); :func:`_threads` sets torch's thread count for
one evaluation and restores it. Measured in ``benchmarks/bench_eval_load.py`` (issue 13).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lowbit.errors import LowbitError

__all__ = ["default_threads"]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _idle_cores(cores: int, sample: float = 0.1) -> float | None:
    """Cores of the machine idle over ``sample`` seconds (``/proc/stat``), at most
    ``cores``; None where that cannot be read (not Linux)."""

    def snapshot() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                fields = [int(v) for v in fh.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        if len(fields) < 5:
            return None
        return sum(fields[:8]), fields[3] + fields[4]  # total, idle + iowait

    first = snapshot()
    time.sleep(sample)
    second = snapshot()
    if first is None or second is None or second[0] <= first[0]:
        return None
    machine = os.cpu_count() or 1
    idle = (second[1] - first[1]) / (second[0] - first[0]) * machine
    return min(float(cores), idle)


def default_threads() -> int:
    """torch threads for an evaluation when none are asked for: the cores this process may
    use (its CPU affinity); with OpenMP's default wait policy, only those idle as it
    starts, at least one.

    Each thread of an OpenMP loop waits at every barrier for the slowest. By default the
    waiting threads spin: on cores other processes hold they take the time slices the
    working thread needs, and two threads on two busy cores ran 6-25x slower than one
    (issue 13; ``benchmarks/bench_eval_load.py``). Under ``OMP_WAIT_POLICY=PASSIVE``
    (which the ``lowbit`` command sets before torch loads) they sleep, and every usable
    core helped there, loaded or not. A machine whose idle time cannot be read gets every
    usable core.
    """
    cores = _cores()
    if os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE":
        return cores
    idle = _idle_cores(cores)
    if idle is None:
        return cores
    return max(1, min(cores, int(idle + 0.5)))


@contextmanager
def _threads(n: int | None) -> Iterator[int]:
    import torch

    old = torch.get_num_threads()
    n = default_threads() if n is None else n
    if n < 1:
        raise LowbitError(f"threads must be >= 1, got {n}")
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(old)


@functools.cache
def _openblas() -> tuple[Any, Any] | None:
    """numpy's bundled OpenBLAS's ``(get_num_threads, set_num_threads)``, or None (another
    BLAS, or a numpy built against a system library lowbit does not look for)."""
    import numpy as np

    root = os.path.dirname(np.__file__)
    found = glob.glob(os.path.join(root, os.pardir, "numpy.libs", "*openblas*"))
    found += glob.glob(os.path.join(root, ".dylibs", "*openblas*"))
    for path in found:
        try:
            lib = ctypes.CDLL(path)  # the copy numpy already loaded
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                return get, put
    return None


@contextmanager
def _numpy_blas_threads(n: int) -> Iterator[bool]:
    """numpy's OpenBLAS held to ``n`` threads inside the block (restored after); yields
    whether it could be set.

    GPTQ alternates torch's forward passes with numpy's float64 solves. OpenBLAS's threads
    spin for a while after each call, on the cores torch's threads are about to use: on 2
    cores, SmolLM2's first 4 blocks of GPTQ took 54 s wall with OpenBLAS on 2 threads and 38 s
    on one, whose solves (matrices of 576-1,536) were also faster (3.8 s against 8.2).
    """
    fns = _openblas()
    if fns is None:
        yield False
        return
    get, put = fns
    old = int(get())
    put(int(n))
    try:
        yield True
    finally:
        put(old)
