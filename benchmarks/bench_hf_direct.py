"""Hugging Face folder -> llama.cpp mix: the direct route (the folder read through
:class:`lowbit.checkpoints.gguf.hf_view.ConvertedView`) against the former two-step route
(convert the whole folder into a temporary GGUF beside the output, then quantize that file),
measured in the same run: wall time (best of ``--repeat``, alternating), peak bytes on disk in the output's folder (polled every
10 ms), and that both write the same bytes.

The source is bench_hf_to_gguf's random bf16 folder of SmolLM2-135M's shape (``--layers`` of
its 30 layers, SmolLM2's tokenizer).

usage: python benchmarks/bench_hf_direct.py [--layers 30] [--mix q4_k_m] [--repeat 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _machine import cpu
from bench_hf_to_gguf import make_folder


def _disk(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass  # renamed or removed while walking
    return total


def _measured(folder: Path, run: Callable[[], None]) -> tuple[float, int]:
    """(seconds, peak bytes under ``folder``) of ``run()``."""
    peak, stop = [0], threading.Event()

    def poll() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _disk(folder))
            time.sleep(0.01)

    t = threading.Thread(target=poll)
    t.start()
    start = time.perf_counter()
    try:
        run()
    finally:
        seconds = time.perf_counter() - start
        stop.set()
        t.join()
    return seconds, max(peak[0], _disk(folder))


def two_steps(folder: Path, out: Path, mix: str) -> None:
    """The former route of ``lowbit.jobs.gguf.gguf_source``: a temporary converted GGUF."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.streaming import quantize_model
    from lowbit.jobs.gguf import gguf_mix
    from lowbit.plans.plan import PrecisionPlan

    keep = PrecisionPlan.from_dict({"rules": [{"match": "*", "format": "keep"}]})
    with tempfile.TemporaryDirectory(prefix=".lowbit-hf-to-gguf-", dir=out.parent) as tmp:
        src = Path(tmp) / (folder.name + ".gguf")
        quantize_model(folder, keep, src, out_format="gguf", progress=False)
        with open_checkpoint(src) as converted:
            gguf_mix(converted, mix, out, progress=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--mix", default="q4_k_m")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each, alternating; best kept")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from lowbit.jobs.gguf import gguf_mix

    with tempfile.TemporaryDirectory() as root:
        r = Path(root)
        folder = make_folder(r, args.layers)
        src_bytes = _disk(folder)
        (r / "old").mkdir()
        (r / "new").mkdir()
        old, new = r / "old" / "m.gguf", r / "new" / "m.gguf"
        t_old = t_new = float("inf")
        d_old = d_new = 0
        for _ in range(args.repeat):  # the first runs also pay imports and numba's compiling
            for p in (old, new):
                p.unlink(missing_ok=True)
            t, d = _measured(r / "old", lambda: two_steps(folder, old, args.mix))
            t_old, d_old = min(t_old, t), max(d_old, d)
            t, d = _measured(
                r / "new", lambda: gguf_mix(folder, args.mix, new, progress=False) and None
            )
            t_new, d_new = min(t_new, t), max(d_new, d)
        same = old.read_bytes() == new.read_bytes()
        row = {
            "layers": args.layers, "mix": args.mix, "source_bytes": src_bytes,
            "output_bytes": new.stat().st_size, "two_steps_s": round(t_old, 2),
            "direct_s": round(t_new, 2), "two_steps_peak_disk": d_old, "direct_peak_disk": d_new,
            "same_bytes": same, "cpu": cpu(),
        }  # fmt: skip
    if args.json:
        print(json.dumps(row))
        return
    mb = 1e6
    print(
        f"{cpu()}\nsource {src_bytes / mb:.1f} MB, {args.mix} output {row['output_bytes'] / mb:.1f} MB"
    )
    print(f"two steps: {t_old:.2f} s, peak disk {d_old / mb:.1f} MB")
    print(f"direct:    {t_new:.2f} s, peak disk {d_new / mb:.1f} MB")
    print(f"same bytes: {same}")


if __name__ == "__main__":
    main()
