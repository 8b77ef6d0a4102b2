"""Calibrated quantization: round-to-nearest vs GPTQ (and AWQ: ``--methods rtn,gptq,awq``) on the
shipped models (quality and time).

- MiniLM (all-MiniLM-L6-v2): int4 g128 symmetric and asymmetric, embedding fidelity on
  ``--sentences`` sentences of the default text (500 as in issue 16), GPTQ calibrated on 256
  other sentences of it (``lowbit.calibration.data``: never one the evaluation measures).
- SmolLM2-135M: int4 g128 symmetric and asymmetric, perplexity on the first ``--tokens`` tokens
  of the default text (16,384 as in issue 16), GPTQ calibrated on ``--calib-samples`` windows of
  512 tokens from token 32,768 (128 by default, the issue's target; 32 as its llm-compressor runs).

Both use ``lowbit.evaluation.variants.evaluate_variants`` (what ``lowbit eval --methods rtn,gptq``
runs) and print each row with GPTQ's seconds per phase. Integer grids: lowbit's symmetric int4
is -7..7 with scale absmax/7; asymmetric is 0..15 around a zero point (codes -8..7 stored).

Usage: ``python benchmarks/bench_gptq.py [minilm|smollm2 ...] [--tokens N] [--calib-samples N]
[--damp F] [--schemes S,...]``. A scheme's scale method is part of its string: ``--schemes
int4:g128:asym:mse`` measures round-to-nearest and GPTQ with MSE-searched clipping per group
(``lowbit.quant.scales``), GPTQ's group scales chosen by the same search.

``--speed N`` instead times ``gptq_weights`` alone on SmolLM2 int4 g128 with N x 512
calibration tokens on one thread (seconds per phase, wall and CPU, and the peak resident
memory of the process); ``make bench`` (benchmarks/run.py) calls :func:`run`, which does that in
a fresh process for its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def measure(model: str, args: argparse.Namespace) -> dict[str, Any]:
    from lowbit.calibration.data import Calibration
    from lowbit.evaluation.variants import evaluate_variants
    from lowbit.methods.gptq import GPTQ

    samples = args.calib_samples if model == "smollm2" else args.calib_texts
    t0, c0 = time.perf_counter(), time.process_time()
    res = evaluate_variants(
        model,
        schemes=args.schemes.split(","),
        methods=args.methods.split(","),
        calibration=Calibration(samples=samples),
        gptq=GPTQ(damp=args.damp, act_order=args.act_order, sequential=args.sequential),
        tokens=args.tokens,
        sentences=args.sentences,
        threads=args.threads,
        progress=False,
    )
    res["gptq_settings"] = GPTQ(
        damp=args.damp, act_order=args.act_order, sequential=args.sequential
    ).describe()
    res["wall_seconds"] = time.perf_counter() - t0
    res["cpu_seconds"] = time.process_time() - c0
    res["load_average"] = os.getloadavg()
    return res


def speed(
    samples: int, scheme: str = "int4:g128", threads: int = 1, sequential: str = "layers"
) -> dict[str, Any]:
    """gptq_weights on SmolLM2 alone: seconds per phase (wall, CPU) and peak memory."""
    import resource

    from lowbit.calibration.data import Calibration
    from lowbit.calibration.gptq import gptq_weights
    from lowbit.methods.gptq import GPTQ

    run_ = gptq_weights(
        "smollm2",
        scheme,
        Calibration(samples=samples),
        GPTQ(sequential=sequential),
        threads=threads,
        progress=False,
    )
    return {
        "scheme": scheme,
        "sequential": run_.sequential,
        "calibration": run_.calibration["described"],
        "tokens": run_.calibration["tokens"],
        "threads": threads,
        "seconds": run_.seconds,
        "cpu_seconds": run_.cpu_seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_average": os.getloadavg(),
    }


def run(quick: bool = False) -> str:
    """The docs/benchmarks.md section (benchmarks/run.py): GPTQ's phases on SmolLM2, timed in
    a fresh process so the peak memory is GPTQ's own."""
    import subprocess
    import tempfile

    samples = 8 if quick else 128
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "speed.json")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        subprocess.run(
            [sys.executable, __file__, "--speed", str(samples), "--json", out],
            check=True, env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        with open(out) as f:
            r = json.load(f)
    w, c = r["seconds"], r["cpu_seconds"]
    rows = "\n".join(f"| {k} | {w[k]:.1f} | {c[k]:.1f} |" for k in w)
    return (
        "## GPTQ (SmolLM2-135M, all 210 linears, int4 g128)\n\n"
        f"`gptq_weights` on {r['calibration']} ({r['tokens']:,} tokens), one thread, static "
        f"act-order, sequential {r['sequential']}; peak resident memory {r['peak_rss_mb']:,.0f} MB; load average at the end "
        f"{r['load_average'][0]:.1f}.\n\n| phase | wall s | CPU s |\n|---|---|---|\n{rows}\n"
    )


def show(model: str, res: dict[str, Any]) -> None:
    print(
        f"\n## {model} ({res['wall_seconds']:.0f} s wall, {res['cpu_seconds']:.0f} s CPU; "
        f"load average at the end {res['load_average'][0]:.1f}; {res['gptq_settings']})"
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
    p.add_argument("--sequential", default="layers", help="GPTQ's order: layers or blocks")
    p.add_argument(
        "--damp", type=float, default=0.01, help="GPTQ's dampening (fraction of mean diag H)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--speed", type=int, metavar="N", help="time gptq_weights alone (N windows)")
    args = p.parse_args(argv)
    if args.speed:
        res = speed(args.speed, args.schemes.split(",")[0], args.threads, args.sequential)
        print(json.dumps(res, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    out = {}
    for m in args.models:
        out[m] = measure(m, args)
        show(m, out[m])
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
