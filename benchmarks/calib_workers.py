"""Measured by hand: GPTQ (or AWQ) calibration in one process against the same split over
local worker processes (``--workers N``), on a shipped model; the wall time, the CPU time of
the driver and its workers, whether the codes are the same, and the load of the machine.

Usage: ``python benchmarks/calib_workers.py smollm2 [--method gptq|awq] [--samples 32]
[--length 256] [--workers 2] [--to int4:g128] [--skip-one-thread]``. Runs: one process on 1 thread, one process on
``--workers`` threads, ``--workers`` processes of 1 thread each (the same cores). Prints one
markdown table row per run.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--method", choices=("gptq", "awq"), default="gptq")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--to", default="int4:g128")
    p.add_argument("--skip-one-thread", action="store_true", help="leave out the 1-thread run")
    args = p.parse_args(argv)

    from lowbit.calibration.calibrated import calibrated_weights
    from lowbit.calibration.data import Calibration
    from lowbit.methods.awq import AWQ
    from lowbit.methods.gptq import GPTQ
    from lowbit.plans.plan import PrecisionPlan

    plan = PrecisionPlan.uniform(args.to)
    calib = Calibration(samples=args.samples, length=args.length)
    method = GPTQ() if args.method == "gptq" else AWQ()
    runs = [("1 process, 1 thread", 1, 1), (f"1 process, {args.workers} threads", args.workers, 1),
            (f"{args.workers} processes, 1 thread each", 1, args.workers)]  # fmt: skip
    if args.skip_one_thread:
        runs = runs[1:]
    print(f"{args.model} {args.method} {args.to}, {args.samples} x {args.length} tokens")
    print("| run | wall s | CPU s (all processes) | load before | same codes |")
    print("|---|---|---|---|---|")
    first = None
    for label, threads, workers in runs:
        load = os.getloadavg()[0]
        t, c = time.perf_counter(), _cpu()
        got = calibrated_weights(args.model, plan, method, calib, threads=threads,
                                 progress=False, workers=workers)  # fmt: skip
        wall, cpu = time.perf_counter() - t, _cpu() - c
        first = first or got.weights
        same = all(
            np.array_equal(first[n].codes, got.weights[n].codes)
            and np.array_equal(first[n].scale, got.weights[n].scale)
            for n in first
        )
        print(f"| {label} | {wall:.0f} | {cpu:.0f} | {load:.1f} | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
