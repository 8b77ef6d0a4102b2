"""How many worker processes or Ray actors a run may start: what was asked, checked, and
capped by what the machine (or the Ray cluster) can run at once.

``--workers 1000000`` started processes with no cap (13-17 within two seconds before it was
stopped), and ``--workers 10**23`` ended in a traceback (issue 41). Now a count outside
1 .. :data:`MAX_WORKERS` is one ``LowbitError`` line, and a valid count above the usable
cores (``os.sched_getaffinity``, else ``os.cpu_count``) or the cluster's CPUs (Ray actors
take one CPU each: more would wait for ever) is lowered to them. The run reports the count
it used.
"""

from __future__ import annotations

import os
from typing import Any

from lowbit.errors import LowbitError

__all__ = ["MAX_WORKERS", "check_workers", "local_workers", "ray_workers", "usable_cores"]

#: The largest count accepted at all (a Ray cluster of more CPUs still gets this many).
MAX_WORKERS = 4096


def usable_cores() -> int:
    """Cores this process may run on (its affinity where the system has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def check_workers(workers: Any, what: str = "workers") -> int:
    """``workers`` as an int from 1 to :data:`MAX_WORKERS`.

    Raises:
        LowbitError: a non-integer, a count below 1 or above the ceiling (one line, the
            number shortened).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        shown = repr(workers) if len(repr(workers)) <= 30 else repr(workers)[:27] + "..."
        raise LowbitError(f"{what} must be a positive integer, got {shown}")
    if workers > MAX_WORKERS:
        digits = len(str(workers))
        shown = str(workers) if digits <= 12 else f"a {digits}-digit number"
        raise LowbitError(
            f"{what} {shown} is past the most lowbit starts ({MAX_WORKERS}); this machine has "
            f"{usable_cores()} usable cores"
        )
    return workers


def local_workers(workers: int) -> int:
    """Local processes for ``workers``: at most the usable cores."""
    return min(check_workers(workers), usable_cores())


def ray_workers(workers: int, cluster_cpus: float) -> int:
    """Ray actors for ``workers`` (1: one per CPU of the cluster): at most its CPUs."""
    cpus = max(1, int(cluster_cpus))
    return cpus if workers <= 1 else min(check_workers(workers), cpus)
