"""Experiment: a sensitivity scan whose trials use GPTQ's weights instead of rounding to nearest.

``lowbit sensitivity`` measures each tensor quantized *to nearest* alone; ``lowbit quantize
--budget B --method gptq`` then solves the budget on those damages and quantizes with GPTQ,
which takes a different share of each tensor's error away. This script asks whether that
matters: for every candidate scheme it runs GPTQ on the whole model (``gptq_weights``, uniform
plan, sequential mode), then runs the ordinary scan (``lowbit.evaluation.sensitivity``, same
calibration options as ``lowbit sensitivity``) with each trial's tensor taken from that GPTQ
run instead of rounded to nearest. The output is an ordinary sensitivity file for ``lowbit
quantize --budget B --sensitivity FILE.json --method gptq``; ``--rtn FILE.json`` prints, per
scheme measured in both, the Spearman correlation of the two scans' damages and the mean ratio
GPTQ/RTN.

Each trial's GPTQ tensor comes from a run where the earlier blocks were GPTQ-quantized in the
same scheme (GPTQ's sequential mode), not from one with only that tensor quantized: close, not
identical, to what a mixed plan's GPTQ gives it.

Usage: ``python benchmarks/mixed_gptq_scan.py minilm --schemes LIST [--exact-schemes LIST]
[--calib-samples N] [--calib-len L] [--gptq-samples N] [--rtn SCAN.json] --out FILE.json``
(one torch thread; it patches the scan's quantizer, so it runs the trials in this process).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--schemes", required=True)
    p.add_argument("--exact-schemes", default="")
    p.add_argument("--calib-samples", type=int)
    p.add_argument("--calib-len", type=int, default=512)
    p.add_argument("--gptq-samples", type=int, help="GPTQ's calibration samples (its default)")
    p.add_argument("--rtn", help="a round-to-nearest scan of the same model to compare with")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch

    from lowbit.calibration.data import Calibration
    from lowbit.calibration.gptq import gptq_weights
    from lowbit.checkpoints.streaming import open_model
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from lowbit.evaluation import sensitivity as sens
    from lowbit.evaluation.scan_samples import is_causal, scan_samples
    from lowbit.evaluation.sensitivity_result import SensitivityResult, spearman
    from lowbit.methods.gptq import GPTQ
    from lowbit.quant.scheme_text import parse_scheme

    torch.set_num_threads(1)
    schemes = [s for s in args.schemes.split(",") if s]
    ckpt = open_model(args.model)
    t0, c0 = time.perf_counter(), time.process_time()
    gptq: dict[tuple[str, str], Any] = {}
    for s in schemes:
        run = gptq_weights(ckpt, s, Calibration(samples=args.gptq_samples), GPTQ(), threads=1,
                           progress=False)  # fmt: skip
        label = parse_scheme(s).label
        gptq.update({(name, label): qt for name, qt in run.weights.items()})
        print(f"gptq {label}: {run.cpu_seconds.get('total', 0):.0f} CPU s", file=sys.stderr)
    gptq_cpu = time.process_time() - c0

    # the tensor whose trial is being quantized, per thread (the scan quantizes a tensor's
    # proxy-only trials on a thread pool while this thread runs the exact ones)
    current = threading.local()
    quantized = sens._Scan._quantized

    def named(self: Any, t: Any, arr: Any, keep: bool = True) -> Any:
        current.name = t.name
        return quantized(self, t, arr, keep)

    def from_gptq(arr: Any, scheme: Any) -> Any:
        return gptq[(current.name, scheme.label)]

    kind = "causal" if is_causal(ckpt) else "encoder"
    tokenizer = build_tokenizer(ckpt)
    calib = scan_samples(kind, tokenizer, "default", samples=args.calib_samples,
                         length=args.calib_len)  # fmt: skip
    c1 = time.process_time()
    plain = sens.quantize
    sens._Scan._quantized = named  # type: ignore[method-assign]
    sens.quantize = from_gptq  # type: ignore[assignment]
    try:
        result = sens.sensitivity(
            ckpt,
            schemes,
            calib,
            tokenizer=tokenizer if kind == "encoder" else None,
            exact_schemes=[s for s in args.exact_schemes.split(",") if s],
        )
    finally:  # the scan is the ordinary one again (a caller in the same process)
        sens._Scan._quantized = quantized  # type: ignore[method-assign]
        sens.quantize = plain  # type: ignore[assignment]
    doc = result.to_dict()
    doc["calibration"] += f"; trials use GPTQ's weights ({args.gptq_samples or 'default'} samples)"
    doc["seconds"]["gptq_cpu"] = gptq_cpu
    doc["seconds"]["scan_cpu"] = time.process_time() - c1
    Path(args.out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(f"wrote {args.out}: GPTQ {gptq_cpu:.0f} CPU s, scan {doc['seconds']['scan_cpu']:.0f} "
          f"CPU s, {time.perf_counter() - t0:.0f} s wall")  # fmt: skip
    if args.rtn:
        rtn = SensitivityResult.from_dict(json.loads(Path(args.rtn).read_text(encoding="utf-8")))
        a, b = rtn.table(), result.table()
        for label in result.schemes:
            pairs = [(a[t][label], b[t][label]) for t in b if label in a.get(t, {})]
            pairs = [(x, y) for x, y in pairs if x.damage is not None and y.damage is not None]
            if len(pairs) < 3:
                continue
            rs = [rtn.score(x) for x, _ in pairs]
            gs = [result.score(y) for _, y in pairs]
            print(f"{label:22s} tensors {len(pairs):3d}  Spearman(rtn, gptq) "
                  f"{spearman(rs, gs):.3f}  sum gptq/sum rtn {sum(gs) / sum(rs):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
