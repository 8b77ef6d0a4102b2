"""Chunk loops on several threads (the quantize and dequantize loops of ``lowbit.quant._engine``).

The chunks of a tensor are independent and write disjoint parts of one output, and the
work in each (numpy on arrays of thousands of values, the ``nogil`` numba kernels)
mostly runs without the GIL, so contiguous bands of chunks go to one thread each.
Threads never change a result: every chunk computes what it would alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")

_MAX_THREADS = 8  # the loops are bound by memory bandwidth long before this
_MIN_CHUNKS = 2


class Switch:
    """A process-wide flag and a context manager that raises it for a block (and restores
    it on exit, errors included): the test hooks ``serial()`` and ``_fast.numpy_only()``."""

    def __init__(self) -> None:
        self.on = False

    @contextlib.contextmanager
    def set(self) -> Iterator[None]:
        old, self.on = self.on, True
        try:
            yield
        finally:
            self.on = old


_serial = Switch()


def serial() -> contextlib.AbstractContextManager[None]:
    """Within this block chunk loops run on the calling thread (tests compare the two)."""
    return _serial.set()


def threads() -> int:
    """Threads the chunk loops use: the cores this process may run on, at most 8."""
    if _serial.on:
        return 1
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, _MAX_THREADS))


@cache
def _pool(n: int, pid: int) -> ThreadPoolExecutor:
    """One pool per size and process (a forked child has none of its parent's threads)."""
    return ThreadPoolExecutor(max_workers=n, thread_name_prefix="lowbit")


_local = threading.local()


def _band(fn: Callable[[Any], T], band: Sequence[Any]) -> list[T]:
    _local.worker = True  # a nested map_chunks runs serially: no waiting on the own pool
    try:
        return [fn(item) for item in band]
    finally:
        _local.worker = False


def map_chunks(fn: Callable[[Any], T], items: Sequence[Any]) -> list[T]:
    """``[fn(item) for item in items]``, contiguous bands of items on separate threads.

    An exception in ``fn`` propagates (the earliest band's first); other bands may have
    run by then, which is harmless as each writes only its own part of the output.
    """
    n = min(threads(), len(items))
    if n <= 1 or len(items) < _MIN_CHUNKS or getattr(_local, "worker", False):
        return [fn(item) for item in items]
    step = -(-len(items) // n)
    bands = [items[i : i + step] for i in range(0, len(items), step)]
    pool = _pool(n, os.getpid())
    # each band runs in a copy of the caller's context, so np.errstate (a context
    # variable) and the like hold in every thread as they do on the calling one
    futures = [pool.submit(contextvars.copy_context().run, _band, fn, b) for b in bands[1:]]
    try:
        first = _band(fn, bands[0])  # the calling thread takes the first band
    finally:
        wait(futures)  # no band still writing when the caller sees a result or an error
    return first + [r for f in futures for r in f.result()]
