"""GPTQ and AWQ calibration spread over worker processes or a Ray cluster, by samples.

Every worker opens the checkpoint from its path, builds the model and runs the one-process
method (``lowbit.calibration.gptq.gptq_weights``, ``lowbit.calibration.awq.awq_weights``) on
its shard of the calibration samples: whole windows of
:attr:`~lowbit.calibration.hessians.HessianCollector.FLUSH` (16) samples, consecutive, worker
0 the first. Where the method would solve (GPTQ: a group of layers reading one input; AWQ: a
block), the worker hands its collector's parts to the driver
(:meth:`~lowbit.calibration.hessians.HessianCollector.parts`: each window's float32
``X^T X``, token counts, AWQ's ``|x|`` statistics) and waits. The driver adds them in sample
order (:meth:`~lowbit.calibration.hessians.HessianCollector.merged`: the additions one process
makes, so the sums are bitwise the one-process sums) and hands the sums back to every
worker; each then solves the same layers from the same sums and the same checkpoint weights
(deterministic: the same codes on every worker), writes them into its model and runs its
samples on through the quantized layers. Worker 0's result is the run's.

Every worker solving, where the driver could solve once and send the weights: the workers
wait for the solve either way, the bytes sent back are one float64 Hessian per layer group
(``in² x 8``, where the weights would be ``out x in x 4`` per layer), and one code path (the
method's own) does every solve. A worker whose shard would be empty (fewer windows than
workers) stops after loading. Bytes and memory per worker, and the arithmetic for a large
model: docs/scale-out.md.

- Local processes (``workers=N``, no ``ray``): ``spawn`` processes, each connected to the
  driver by a pipe.
- Ray (``ray=True`` or an address): ``N`` actors (``1``: one per CPU the cluster reports);
  every node must read the checkpoint's path and import lowbit.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from lowbit._workers_cap import check_workers, local_workers, ray_workers
from lowbit.calibration.awq import awq_weights
from lowbit.calibration.gptq import gptq_weights
from lowbit.calibration.hessians import HessianCollector, add_parts, parts_kept
from lowbit.errors import LowbitError
from lowbit.models._threads import _cores

__all__ = ["distributed_calibration"]

_RUNS: dict[str, Callable[..., Any]] = {"gptq": gptq_weights, "awq": awq_weights}


class _Idle(Exception):
    """Raised by :meth:`_Session.shard` in a worker with no samples to calibrate on."""


def shard_range(count: int, index: int, workers: int) -> tuple[int, int]:
    """Worker ``index``'s samples ``[start, stop)`` of ``count``: consecutive whole windows
    of ``FLUSH`` samples (the last may be short), as evenly as windows allow; with fewer
    windows than workers the last workers get none."""
    size = HessianCollector.FLUSH
    windows = -(-count // size)
    used = min(workers, windows)  # the first ``used`` workers get a window or more
    if index >= used:
        return count, count
    lo, hi = index * windows // used, (index + 1) * windows // used
    return min(lo * size, count), min(hi * size, count)


class _Session:
    """One worker's run of the method, in a thread of its own so that the driver can step
    it: :meth:`step` hands in the driver's reply (None at first) and returns the worker's next
    message: ``("reduce", layers, parts)``, ``("done", run or None)``, ``("idle", None)``,
    ``("error", line)`` or ``("crash", traceback)``."""

    def __init__(self, kind: str, path: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                 index: int, workers: int) -> None:  # fmt: skip
        self.index, self.workers = index, workers
        self._out: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self._in: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(
            target=self._main, args=(kind, path, args, kwargs), daemon=True
        )
        self._thread.start()

    def _main(self, kind: str, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            with parts_kept():
                run = _RUNS[kind](path, *args, **kwargs, _worker=self)
            self._out.put(("done", run if self.index == 0 else None, None))
        except _Idle:
            self._out.put(("idle", None, None))
        except LowbitError as exc:
            self._out.put(("error", str(exc).splitlines()[-1] if str(exc) else "", None))
        except BaseException:  # handed to the driver, which raises it
            self._out.put(("crash", traceback.format_exc(), None))

    def shard(self, samples: list[Any]) -> list[Any]:
        lo, hi = shard_range(len(samples), self.index, self.workers)
        if lo >= hi:
            raise _Idle
        return samples[lo:hi]

    def reduce(self, col: HessianCollector) -> HessianCollector:
        self._out.put(("reduce", sorted(col.linears), col.parts()))
        return HessianCollector.from_sums(col.linears, self._in.get())

    def step(self, reply: Any = None) -> tuple[str, Any, Any]:
        if reply is not None:
            self._in.put(reply)
        return self._out.get()


def _serve(conn: Any, kind: str, path: str, args: tuple[Any, ...], kwargs: dict[str, Any],
           index: int, workers: int) -> None:  # fmt: skip
    """A local worker process: its session, stepped over the pipe."""
    session = _Session(kind, path, args, kwargs, index, workers)
    reply = None
    while True:
        msg = session.step(reply)
        conn.send(msg)
        kind, msg = msg[0], None  # the parts sent are not kept through the solve
        if kind != "reduce":
            break
        reply = conn.recv()
    conn.close()


def _drive(step: Callable[[Any], Iterator[tuple[str, Any, Any]]]) -> tuple[Any, int, int]:
    """Step every worker until all are done, adding each reduction's parts in worker order.

    Args:
        step: hands the reply (None at first, then the sums of a reduction) to every
            worker still running and yields their messages, in worker order.

    Returns:
        ``(worker 0's run, workers that calibrated, reductions)``.
    """
    kinds, first, sums, layers = _gather(step(None))
    active = len(kinds) - kinds.count("idle")
    reductions = 0
    while True:
        kinds = [k for k in kinds if k != "idle"]
        if set(kinds) == {"done"}:
            return first, active, reductions
        if set(kinds) != {"reduce"} or len(layers) != 1:  # pragma: no cover - a bug
            raise LowbitError(
                f"calibration workers diverged at reduction {reductions}: {sorted(set(kinds))}"
            )
        reductions += 1
        kinds, first, sums, layers = _gather(step(sums))


def _gather(
    msgs: Iterator[tuple[str, Any, Any]],
) -> tuple[list[str], Any, dict[str, Any], set[tuple[str, ...]]]:
    """The kinds of the workers' messages, worker 0's run, the reductions' parts added in
    worker order (each dropped once added) and the layers each reduction names.

    Raises:
        LowbitError: a worker's LowbitError (the first).
        RuntimeError: a worker's other error, with its traceback.
    """
    kinds: list[str] = []
    first: Any = None
    sums: dict[str, Any] = {}
    layers: set[tuple[str, ...]] = set()
    crash = error = None
    for kind, payload, parts in msgs:  # every message is read, so no worker is left waiting
        kinds.append(kind)
        if kind == "crash":
            crash = crash or payload
        elif kind == "error":
            error = error or payload
        elif kind == "done" and len(kinds) == 1:
            first = payload
        elif kind == "reduce" and crash is None and error is None:
            layers.add(tuple(payload))
            add_parts(sums, parts)
        del parts
    if crash is not None:
        raise RuntimeError(f"a calibration worker failed:\n{crash}")
    if error is not None:
        raise LowbitError(error)
    return kinds, first, sums, layers


def distributed_calibration(
    kind: str,
    path: str | os.PathLike[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    workers: int,
    ray: bool | str = False,
) -> Any:
    """Run ``gptq_weights`` or ``awq_weights`` with its calibration samples split over
    worker processes or Ray actors (see the module docstring).

    Args:
        kind: ``gptq`` or ``awq``.
        path: the checkpoint's path or a shipped model's name (every worker opens it).
        args: the method function's positional arguments after the model (scheme or plan,
            calibration, method).
        kwargs: its keyword arguments (``threads``: per worker; default the usable cores
            divided among the local workers, 1 for a Ray actor).
        workers: worker processes or actors (Ray: 1 = one per CPU of the cluster).
        ray: False (local processes), True (``RAY_ADDRESS`` or a local instance) or an
            address.

    Returns:
        The method's run (``GPTQRun``, ``AWQRun``) as one process makes it, with
        ``seconds["workers"]`` (workers that calibrated) and ``seconds["reductions"]``.

    Raises:
        LowbitError: ``workers`` below 1, an unreachable Ray address, a worker's error.
        ImportError: Ray asked for and not installed.
    """
    if kind not in _RUNS:
        raise LowbitError(f"distributed calibration runs gptq or awq, got {kind!r}")
    check_workers(workers)
    path = str(path)
    t0 = time.perf_counter()
    kwargs = {**kwargs, "progress": False}
    if ray is not False:
        run, used, reductions = _ray_run(kind, path, args, kwargs, workers, ray)
    else:
        run, used, reductions = _local_run(kind, path, args, kwargs, workers)
    run.seconds["total"] = time.perf_counter() - t0
    run.seconds["workers"] = float(used)
    run.seconds["reductions"] = float(reductions)
    return run


def _local_run(
    kind: str, path: str, args: tuple[Any, ...], kwargs: dict[str, Any], workers: int
) -> tuple[Any, int, int]:
    import multiprocessing

    workers = local_workers(workers)  # no more processes than cores
    if kwargs.get("threads") is None:
        kwargs = {**kwargs, "threads": max(1, _cores() // workers)}
    ctx = multiprocessing.get_context("spawn")  # torch and fork do not mix
    conns, procs = [], []
    try:
        for i in range(workers):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(theirs, kind, path, args, kwargs, i, workers),
                            daemon=True)  # fmt: skip
            p.start()
            theirs.close()
            conns.append(mine)
            procs.append(p)
        live = list(range(workers))

        def step(reply: Any) -> Iterator[tuple[str, Any, Any]]:
            if reply is not None:
                for i in live:
                    conns[i].send(reply)
            still = []
            for i in list(live):
                msg = _receive(conns[i], procs[i])
                if msg[0] == "reduce":
                    still.append(i)
                yield msg
            live[:] = still

        return _drive(step)
    finally:
        for c in conns:  # a worker waiting for a reply gets EOFError and ends
            c.close()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():  # pragma: no cover - a worker stuck after an error
                p.kill()
                p.join()


def _receive(conn: Any, proc: Any) -> tuple[str, Any, Any]:
    try:
        return conn.recv()
    except EOFError:
        raise LowbitError(
            f"a calibration worker process exited (code {proc.exitcode}) before it answered; "
            "out of memory?"
        ) from None


def _ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("--ray needs Ray: pip install 'lowbit[ray]'") from None
    return ray


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a Ray address nothing listens at (Ray itself retries for a minute).

    Raises:
        LowbitError: ``host:port`` or ``ray://host:port`` that refuses or times out a TCP
            connection, or that is not of that form (``auto``/``local`` are left to Ray).
    """
    if address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise LowbitError(f"--ray {address!r}: give HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise LowbitError(f"cannot reach a Ray cluster at {address}: {exc}") from None


def _ray_run(
    kind: str, path: str, args: tuple[Any, ...], kwargs: dict[str, Any], workers: int,
    address: bool | str,
) -> tuple[Any, int, int]:  # fmt: skip
    ray = _ray_module()
    if not ray.is_initialized():
        if address is not True:
            check_ray_address(str(address))
        try:
            ray.init(address=None if address is True else str(address), include_dashboard=False,
                     log_to_driver=False)  # fmt: skip
        except (ConnectionError, RuntimeError, ValueError) as exc:
            line = str(exc).strip().splitlines()
            raise LowbitError(
                f"cannot start Ray at {address}: {line[0] if line else exc}"
            ) from None
    workers = ray_workers(workers, ray.cluster_resources().get("CPU", 1))  # 1 actor per CPU
    if kwargs.get("threads") is None:
        kwargs = {**kwargs, "threads": 1}

    @ray.remote(num_cpus=1)
    class _Actor:  # pragma: no cover - runs in Ray's worker processes
        def __init__(self, index: int) -> None:
            self.session = _Session(kind, path, args, kwargs, index, workers)

        def step(self, reply: Any) -> tuple[str, Any, Any]:
            return self.session.step(reply)

    actors = [_Actor.remote(i) for i in range(workers)]
    live = list(range(workers))

    def step(reply: Any) -> Iterator[tuple[str, Any, Any]]:
        ref = None if reply is None else ray.put(reply)  # stored once, read by every actor
        refs = [actors[i].step.remote(ref) for i in live]
        still = []
        for i, r in zip(list(live), refs, strict=True):
            msg = ray.get(r)
            if msg[0] == "reduce":
                still.append(i)
            yield msg
        live[:] = still

    try:
        return _drive(step)
    finally:
        for a in actors:
            ray.kill(a)
