"""Calibrated quantization: round-to-nearest vs GPTQ (and AWQ: ``--methods rtn,gptq,awq``) on the
shipped models (quality and time).

- MiniLM (all-MiniLM-L6-v2): int4 g128 symmetric and asymmetric, embedding fidelity on
  ``--sentences`` sentences of the default text (500 as in issue 16), GPTQ calibrated on 256
  other sentences of it (``lowbit.evaluation.calibration``: never one the evaluation measures).
- SmolLM2-135M: int4 g128 symmetric and asymmetric, perplexity on the first ``--tokens`` tokens
  of the default text (16,384 as in issue 16), GPTQ calibrated on ``--calib-samples`` windows of
  512 tokens from token 32,768 (128 by default, the issue's target; 32 as its llm-compressor runs).

Both use ``lowbit.evaluation.variants.evaluate_variants`` (what ``lowbit eval --methods rtn,gptq``
runs) and print each row with GPTQ's seconds per phase. Integer grids: lowbit's symmetric int4
is -7..7 with scale absmax/7; asymmetric is 0..15 around a zero point (codes -8..7 stored).

Usage: ``python benchmarks/bench_gptq.py [minilm|smollm2 ...] [--tokens N] [--calib-samples N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def run(model: str, args: argparse.Namespace) -> dict[str, Any]:
    from lowbit.evaluation.calibration import Calibration
    from lowbit.evaluation.variants import evaluate_variants
    from lowbit.quant.gptq import GPTQ

    samples = args.calib_samples if model == "smollm2" else args.calib_texts
    t0, c0 = time.perf_counter(), time.process_time()
    res = evaluate_variants(
        model,
        schemes=args.schemes.split(","),
        methods=args.methods.split(","),
        calibration=Calibration(samples=samples),
        gptq=GPTQ(act_order=args.act_order),
        tokens=args.tokens,
        sentences=args.sentences,
        threads=args.threads,
        progress=False,
    )
    res["wall_seconds"] = time.perf_counter() - t0
    res["cpu_seconds"] = time.process_time() - c0
    res["load_average"] = os.getloadavg()
    return res


def show(model: str, res: dict[str, Any]) -> None:
    print(
        f"\n## {model} ({res['wall_seconds']:.0f} s wall, {res['cpu_seconds']:.0f} s CPU; "
        f"load average at the end {res['load_average'][0]:.1f})"
    )
    for r in res["rows"]:
        if res["kind"] == "encoder":
            q = f"mean cos {r['mean_cosine']:.4f}  min {r['min_cosine']:.4f}  NN {r['nn_agreement']:.3f}"
        else:
            q = f"ppl {r['perplexity']:.4f}  change {r['change'] * 100:+.2f}%  KL {r['kl_mean']:.4f}"
        print(f"{r['name']:<24} {q}")
        if isinstance(r.get("calibration"), dict):
            t, c = r["phase_seconds"], r.get("phase_cpu_seconds", {})
            print(
                f"{'':<24} calibration: {r['calibration']['described']} "
                f"({r['calibration']['tokens']:,} tokens); seconds: "
                + ", ".join(f"{k} {v:.1f}" for k, v in t.items())
                + "; CPU seconds: "
                + ", ".join(f"{k} {v:.1f}" for k, v in c.items())
                + f"; layer error {r.get('layer_error_gptq', r.get('layer_error_method')):.4g} "
                f"vs rtn {r['layer_error_rtn']:.4g}"
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=["minilm", "smollm2"])
    p.add_argument("--schemes", default="int4:g128,int4:g128:asym")
    p.add_argument(
        "--methods", default="rtn,gptq", help="rtn, gptq, awq; gptq alone skips the RTN rows"
    )
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--sentences", type=int, default=500)
    p.add_argument("--calib-samples", type=int, default=128)
    p.add_argument("--calib-texts", type=int, default=256)
    p.add_argument("--act-order", default="static")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    out = {}
    for m in args.models:
        out[m] = run(m, args)
        show(m, out[m])
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
