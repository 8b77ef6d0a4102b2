"""What ``--compute bf16`` changes against float32, and what it saves (issue 28), measured by hand.

Parts (``--parts matmul,eval,gptq,scan``; all by default), each fp32 and bf16 in one process,
alternated (A B A B) where timed, medians and ratios printed as JSON lines:

- ``matmul``: a 2048 x 2048 torch matmul, float32 against bfloat16, 1 and 2 threads, and
  the verdict of ``auto`` at each thread count (``lowbit.models._compute.fast_bf16``'s own
  timing of one linear layer, measured afresh in a temporary cache directory).
- ``eval``: ``evaluate_variants`` on SmolLM2 (``--tokens``, windows of 256) with the original
  and ``--scheme`` rounded to nearest: perplexity, KL, top-1, seconds, per compute.
- ``gptq``: ``gptq_weights`` of SmolLM2 with ``--scheme`` on ``--calib-samples`` x
  ``--calib-len`` tokens: the fraction of codes that differ between fp32 and bf16, seconds.
- ``gptq_ppl``: GPTQ calibrated in fp32 and in bf16, both evaluated in fp32 on the first
  ``--tokens`` tokens (held-out: calibration starts at token 32,768): perplexity and KL.
- ``scan``: ``sensitivity`` (exact, ``--scan-tensors`` globs, ``--scan-schemes``): Spearman of
  the bf16 damages against the fp32 ones, and of the proxies.

Usage: ``PYTHONPATH=src python benchmarks/compute_precision.py --tokens 1024``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from _machine import cpu


def _print(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def matmul(rounds: int) -> None:
    import torch

    n = 2048
    for threads in (1, 2):
        torch.set_num_threads(threads)
        a, b = torch.randn(n, n), torch.randn(n, n)
        ab, bb = a.bfloat16(), b.bfloat16()
        a @ b, ab @ bb  # warm-up
        t32, t16 = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            a @ b
            t32.append(time.perf_counter() - t)
            t = time.perf_counter()
            ab @ bb
            t16.append(time.perf_counter() - t)
        m32, m16 = statistics.median(t32), statistics.median(t16)
        flop = 2 * n**3 / 1e9
        auto = _auto_verdict()
        _print({"part": "matmul", "threads": threads, "fp32_ms": m32 * 1e3, "bf16_ms": m16 * 1e3,
                "fp32_gflops": flop / m32, "bf16_gflops": flop / m16, "bf16_speedup": m32 / m16,
                "auto": auto, "load": os.getloadavg()[0]})  # fmt: skip


def _auto_verdict() -> dict[str, Any]:
    """What ``--compute auto`` decides at torch's current thread count, timed afresh."""
    import tempfile

    from lowbit.models import _compute

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LOWBIT_CACHE_DIR"] = tmp
        try:
            _compute._choice.known = None
            verdict = _compute.resolve_compute("auto")
            entry = (_compute._choice.known or {}).get("linear", {})
        finally:
            os.environ.pop("LOWBIT_CACHE_DIR")
            _compute._choice.known = None
    speedup = entry["fp32_ns"] / entry["bf16_ns"] if entry else None
    return {"verdict": verdict, "bf16_units": _compute.bf16_units(), "linear_speedup": speedup}


def evaluate(args: argparse.Namespace) -> None:
    from lowbit.evaluation.variants import evaluate_variants

    runs: dict[str, list[dict[str, Any]]] = {"fp32": [], "bf16": []}
    for _ in range(args.rounds):
        for compute in ("fp32", "bf16"):
            res = evaluate_variants(
                "smollm2", schemes=[args.scheme], tokens=args.tokens, window=256,
                threads=args.threads, progress=False, compute=compute,
            )  # fmt: skip
            runs[compute].append(res)
    out: dict[str, Any] = {"part": "eval", "tokens": args.tokens, "scheme": args.scheme}
    for compute, rs in runs.items():
        rows = rs[0]["rows"]
        out[compute] = {
            "perplexity": [r["perplexity"] for r in rows],
            "kl_mean": [r["kl_mean"] for r in rows],
            "top1": [r["top1_agreement"] for r in rows],
            "seconds_median": statistics.median(r["measured"]["seconds"] for r in rs),
            "ran": rs[0]["measured"]["compute"],
        }
    f, b = out["fp32"], out["bf16"]
    out["perplexity_rel_change"] = [
        y / x - 1 for x, y in zip(f["perplexity"], b["perplexity"], strict=True)
    ]
    out["speedup"] = f["seconds_median"] / b["seconds_median"]
    out["load"] = os.getloadavg()[0]
    _print(out)


def gptq(args: argparse.Namespace) -> None:
    import numpy as np

    from lowbit.calibration.data import Calibration
    from lowbit.calibration.gptq import gptq_weights

    calib = Calibration(samples=args.calib_samples, length=args.calib_len)
    runs = {}
    secs: dict[str, float] = {}
    for compute in ("fp32", "bf16"):
        t = time.perf_counter()
        runs[compute] = gptq_weights(
            "smollm2", args.scheme, calib, progress=False, threads=args.threads, compute=compute
        )
        secs[compute] = time.perf_counter() - t
    diff = total = 0
    tensors_changed = 0
    for name, qt in runs["fp32"].weights.items():
        other = runs["bf16"].weights[name]
        d = int(np.count_nonzero(np.asarray(qt.codes) != np.asarray(other.codes)))
        diff += d
        total += int(np.asarray(qt.codes).size)
        tensors_changed += d > 0
    _print({"part": "gptq", "scheme": args.scheme, "samples": args.calib_samples,
            "length": args.calib_len, "codes_differing": diff, "codes": total,
            "fraction": diff / total, "tensors_changed": tensors_changed,
            "tensors": len(runs["fp32"].weights), "seconds": secs,
            "phase_seconds": {c: r.seconds for c, r in runs.items()},
            "load": os.getloadavg()[0]})  # fmt: skip


def gptq_ppl(args: argparse.Namespace) -> None:
    """GPTQ calibrated in fp32 and in bf16, both measured in fp32 on the first ``--tokens``
    tokens of the default text (calibration never overlaps them): held-out perplexity."""
    from lowbit.calibration.data import Calibration
    from lowbit.checkpoints.streaming import open_model
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from lowbit.evaluation._compare import compare_causal
    from lowbit.evaluation.calibrated_variants import gptq_variant
    from lowbit.models.build import build_model

    ckpt = open_model("smollm2")
    calib = Calibration(samples=args.calib_samples, length=args.calib_len)
    variants, secs = [], {}
    for compute in ("fp32", "bf16"):
        t = time.perf_counter()
        v = gptq_variant(ckpt, args.scheme, calib, progress=False, threads=args.threads,
                         compute=compute)  # fmt: skip
        secs[compute] = time.perf_counter() - t
        v.name = f"{args.scheme} gptq ({compute} calibration)"
        variants.append(v)
    reference = build_model(ckpt, progress=False)
    measured, rows = compare_causal(
        variants, reference, build_tokenizer(ckpt), max_tokens=args.tokens, window=256,
        progress=False, threads=args.threads,
    )  # fmt: skip
    ppl = [r["perplexity"] for r in rows]
    _print({"part": "gptq_ppl", "scheme": args.scheme, "samples": args.calib_samples,
            "length": args.calib_len, "tokens": args.tokens, "eval_compute": measured["compute"],
            "perplexity_fp32_calibration": ppl[0], "perplexity_bf16_calibration": ppl[1],
            "rel_change": ppl[1] / ppl[0] - 1, "kl": [r["kl_mean"] for r in rows],
            "seconds": secs, "load": os.getloadavg()[0]})  # fmt: skip


def scan(args: argparse.Namespace) -> None:
    from lowbit.checkpoints.streaming import open_model
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from lowbit.evaluation.scan_samples import scan_samples
    from lowbit.evaluation.sensitivity import sensitivity
    from lowbit.evaluation.sensitivity_result import spearman

    ckpt = open_model("smollm2")
    tok = build_tokenizer(ckpt)
    calib = scan_samples("causal", tok, "default", samples=args.scan_samples, length=512)
    res, secs = {}, {}
    for compute in ("fp32", "bf16"):
        t = time.perf_counter()
        res[compute] = sensitivity(
            ckpt, args.scan_schemes.split(","), calib, measure="exact",
            tensors=args.scan_tensors.split(","), compute=compute,
        )  # fmt: skip
        secs[compute] = time.perf_counter() - t
    f, b = res["fp32"].entries, res["bf16"].entries
    _print({"part": "scan", "tensors": args.scan_tensors, "schemes": args.scan_schemes,
            "trials": len(f), "samples": args.scan_samples,
            "spearman_damage": spearman([e.damage for e in f], [e.damage for e in b]),
            "spearman_proxy": spearman([e.proxy for e in f], [e.proxy for e in b]),
            "seconds": secs, "load": os.getloadavg()[0]})  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="matmul,eval,gptq,scan")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--scheme", default="int4:g128")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--calib-samples", type=int, default=16)
    p.add_argument("--calib-len", type=int, default=256)
    p.add_argument("--scan-tensors", default="blk.0.*,blk.15.*,blk.29.*")
    p.add_argument("--scan-schemes", default="int4:g128,int3:g128")
    p.add_argument("--scan-samples", type=int, default=4)
    args = p.parse_args()
    _print({"cpu": cpu(), "load": os.getloadavg()[0]})
    parts = args.parts.split(",")
    if "matmul" in parts:
        matmul(5)
    if "eval" in parts:
        evaluate(args)
    if "gptq" in parts:
        gptq(args)
    if "gptq_ppl" in parts:
        gptq_ppl(args)
    if "scan" in parts:
        scan(args)


if __name__ == "__main__":
    main()
