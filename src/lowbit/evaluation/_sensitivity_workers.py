"""Sensitivity trials on worker processes or a Ray cluster, gathered on the driver.

The trials of a scan are independent: each quantizes one tensor with one scheme and measures
the model against the original on the same calibration data. A worker opens the checkpoint
from its path, builds the model, runs the original once (the cached block inputs, the
reference outputs, the input moments) and then any trials it is handed. The driver numbers
the trials as a one-process scan does (scheme-major, tensors in model order), hands them out
in chunks, and puts the entries back in that order, so a distributed result equals a local one.

- Local processes (``workers=N``): a ``spawn`` process pool whose initializer builds one scan
  per process; chunks of trials are mapped over it.
- Ray (``ray=True`` or an address): ``N`` actors, each holding one scan, fed chunks by Ray's
  own scheduling (``ray.util.ActorPool``); every node must be able to read the checkpoint's
  path and import lowbit.

What each worker holds, and the arithmetic for a large model, is in docs/scale-out.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from lowbit._workers_cap import local_workers, ray_workers
from lowbit.checkpoints import open_checkpoint
from lowbit.errors import LowbitError
from lowbit.models._threads import _cores

__all__ = ["distributed_scan"]

# One scan per worker process, built by the pool's initializer; a process-local cache, not
# shared state: every process builds the same scan from the same arguments.
_STATE: dict[str, Any] = {}


def _build(scan_type: Any, path: str, args: tuple[Any, ...], threads: int) -> Any:
    import torch

    torch.set_num_threads(max(1, threads))
    return scan_type(open_checkpoint(path), *args)


def _init(scan_type: Any, path: str, args: tuple[Any, ...], threads: int) -> None:
    _STATE["scan"] = _build(scan_type, path, args, threads)


def _chunk(trials: Sequence[int], cached: bool) -> tuple[str, list[Any], dict[str, float]]:
    scan = _STATE["scan"]
    return scan.kind, [scan.run(i, cached) for i in trials], scan.seconds


def _chunks(costs: Sequence[float], parts: int) -> list[list[int]]:
    """Trials in chunks of consecutive numbers and about equal cost, about eight chunks per
    worker (for progress, and so that no worker is left with most of the work: a trial that
    runs the model costs about a hundred that compute only the proxy)."""
    share = sum(costs) / (8 * parts)
    out: list[list[int]] = [[]]
    acc = 0.0
    for i, c in enumerate(costs):
        if out[-1] and acc + c > share:
            out.append([])
            acc = 0.0
        out[-1].append(i)
        acc += c
    return out


def _costs(count: int, tensors: int, measure: str, exact: set[int]) -> list[float]:
    """Relative cost of each trial (numbered scheme-major): 1 runs the model, 0.01 does not."""
    return [1.0 if measure == "exact" and i // tensors in exact else 0.01 for i in range(count)]


def distributed_scan(
    path: str | os.PathLike[str],
    schemes: tuple[str, ...],
    calibration: Any,
    *,
    tokenizer: Any,
    measure: str,
    cached: bool,
    batch: int,
    progress: Callable[[int, int], None] | None,
    workers: int,
    ray: bool | str,
    select: tuple[str, ...] = (),
    exact_schemes: tuple[str, ...] = (),
    proxy: str = "input",
    compute: str = "fp32",
    scan_type: Any,
    plans: Any,
) -> tuple[str, list[Any], dict[str, float]]:
    """Run every trial on worker processes or Ray actors.

    ``scan_type`` is the class each worker builds (``sensitivity._Scan``) and ``plans`` the
    function that numbers the trials (``sensitivity._plans``), passed in so this module does
    not import the one that calls it.

    Returns:
        ``(kind, entries in scan order, seconds)``.

    Raises:
        ImportError: Ray asked for and not installed.
        LowbitError: a worker's error (the first), re-raised on the driver.
    """
    path = str(Path(path).resolve())
    applied, names = plans(open_checkpoint(path), schemes, select)
    count = len(applied) * len(names)
    exact = {i for i, s in enumerate(schemes) if not exact_schemes or s in exact_schemes}
    costs = _costs(count, len(names), measure, exact)
    args = (schemes, calibration, tokenizer, measure, batch, select, exact_schemes, proxy, compute)
    t0 = time.perf_counter()
    if ray is not False:
        kind, results, worker_seconds, used = _ray_scan(
            scan_type, path, args, costs, cached, workers, ray, progress
        )
    else:
        kind, results, worker_seconds, used = _local_scan(
            scan_type, path, args, costs, cached, workers, progress
        )
    entries = [results[i] for i in range(count)]
    seconds = {f"worker_{k}": v for k, v in worker_seconds.items()}
    seconds.update(trials=time.perf_counter() - t0, workers=float(used))
    return kind, entries, seconds


def _local_scan(
    scan_type: Any,
    path: str,
    args: tuple[Any, ...],
    costs: Sequence[float],
    cached: bool,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[str, dict[int, Any], dict[str, float], int]:
    import multiprocessing

    workers = local_workers(workers)  # no more processes than cores
    threads = max(1, _cores() // workers)
    ctx = multiprocessing.get_context("spawn")  # torch and fork do not mix
    results: dict[int, Any] = {}
    kind, seconds = "", {}
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                             initargs=(scan_type, path, args, threads)) as pool:  # fmt: skip
        chunks = _chunks(costs, workers)
        futures = [(c, pool.submit(_chunk, c, cached)) for c in chunks]
        for c, fut in futures:
            kind, entries, seconds = fut.result()
            results.update(zip(c, entries, strict=True))
            if progress is not None:
                progress(len(results), len(costs))
    return kind, results, seconds, workers


def _ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("--ray needs Ray: pip install 'lowbit[ray]'") from None
    return ray


def _ray_scan(
    scan_type: Any,
    path: str,
    args: tuple[Any, ...],
    costs: Sequence[float],
    cached: bool,
    workers: int,
    address: bool | str,
    progress: Callable[[int, int], None] | None,
) -> tuple[str, dict[int, Any], dict[str, float], int]:
    ray = _ray_module()
    from ray.util import ActorPool

    if not ray.is_initialized():
        ray.init(address=None if address is True else str(address), include_dashboard=False,
                 log_to_driver=False)  # fmt: skip
    workers = ray_workers(workers, ray.cluster_resources().get("CPU", 1))  # 1 actor per CPU

    @ray.remote(num_cpus=1)
    class _Actor:  # pragma: no cover - runs in Ray's worker processes
        def __init__(self, path: str, args: tuple[Any, ...]) -> None:
            self.scan = _build(scan_type, path, args, 1)

        def run(self, trials: Sequence[int]) -> tuple[list[int], str, list[Any], dict[str, Any]]:
            return (
                list(trials),
                self.scan.kind,
                [self.scan.run(i, cached) for i in trials],
                (self.scan.seconds),
            )

    actors = [_Actor.remote(path, args) for _ in range(workers)]
    pool = ActorPool(actors)
    results: dict[int, Any] = {}
    kind, seconds = "", {}
    try:
        for trials, k, entries, s in pool.map_unordered(
            lambda a, c: a.run.remote(c), _chunks(costs, workers)
        ):
            kind, seconds = k, s
            results.update(zip(trials, entries, strict=True))
            if progress is not None:
                progress(len(results), len(costs))
    except ray.exceptions.RayTaskError as exc:
        cause = exc.as_instanceof_cause()
        if isinstance(cause, LowbitError):
            raise LowbitError(str(cause).splitlines()[-1]) from None
        raise
    finally:
        for a in actors:
            ray.kill(a)
    return kind, results, seconds, workers
