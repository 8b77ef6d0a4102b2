"""Encode speed of llama.cpp's i-quants below 4 bits (lowbit.ggml.blocks.quantize): a
ROWS x 4096 float32 matrix of N(0, 1) with an importance vector, one run per type after a
warm-up (numba kernels loaded and compiled), in values per second of wall time and per
CPU-second (all threads), on the numba path (``--numpy``: the numpy path).

Not part of ``make bench`` (minutes at 4096 rows). usage:
python benchmarks/iq_encode_speed.py [--rows 4096] [--numpy] [TYPE ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _machine import cpu

TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")


def main() -> None:
    from lowbit.codecs import _numba
    from lowbit.ggml import blocks, iq_grids

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("types", nargs="*", default=TYPES)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--numpy", action="store_true", help="the numpy path (no numba kernels)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, 4096)).astype(np.float32)
    im = rng.uniform(0.1, 10, 4096).astype(np.float32)
    print(cpu(), "numpy path" if args.numpy else "numba path")
    for t in args.types:
        t = t.upper()
        iq_grids.lattice("IQ1_S" if t.startswith("IQ1") else t)  # built once per process
        switch = _numba.numpy_only() if args.numpy else _numba.kernels_always()
        with switch:
            blocks.quantize(x[:2], t, imatrix=im)
            wall, cpu_s = time.perf_counter(), time.process_time()
            blocks.quantize(x, t, imatrix=im)
            wall, cpu_s = time.perf_counter() - wall, time.process_time() - cpu_s
        print(
            f"{t:8s} {x.size / wall / 1e6:6.2f} M values/s wall ({wall:6.1f} s), "
            f"{x.size / cpu_s / 1e6:6.2f} M values per CPU-second",
            flush=True,
        )


if __name__ == "__main__":
    main()
