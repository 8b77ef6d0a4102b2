"""Batched windows in ``lowbit eval``'s measuring loop: CPU seconds, tokens/s and the numbers.

SmolLM2-135M (the shipped GGUF, float32 in torch) and its int4:g128 variant (what ``lowbit eval
smollm2 --schemes int4:g128`` builds) measured by ``compare_causal``, the loop ``lowbit eval``
runs, at each batch size in turn, ``--repeats`` times round-robin in one process (so the
models' load and quantization, the same at every batch, stay out of the figures and a change
of machine load hits every batch size alike). Reported per batch: the loop's CPU seconds
(``time.process_time``, every thread) and wall seconds (medians over the repeats), tokens/s
(4,096 tokens through two models over the wall time), the resident-memory peak, and the
perplexities, KL and top-1 agreement with their relative differences from batch 1.

Run by hand (not by ``make bench``), one thread on a shared machine::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=src python benchmarks/eval_batch.py \
        --threads 1 --batches 1,2,4,8 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--json", metavar="FILE", help="also write the raw figures here")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]

    from lowbit.checkpoints.streaming import open_model
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from lowbit.evaluation import variants as ev
    from lowbit.models.build import build_model

    ckpt = open_model("smollm2")
    tok = build_tokenizer(ckpt)
    ref = build_model(ckpt, progress=False)
    int4 = ev._scheme_variant(ckpt, "int4:g128", False)
    variants = [ev.Variant("original", "", ref), int4]
    runs: dict[int, list[dict[str, Any]]] = {b: [] for b in batches}
    loads = [os.getloadavg()[0]]
    for _ in range(args.repeats):
        for b in batches:
            c0, t0 = time.process_time(), time.perf_counter()
            measured, rows = ev.compare_causal(
                variants, ref, tok, max_tokens=args.tokens, window=args.window,
                threads=args.threads, batch=b, progress=False,
            )  # fmt: skip
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            runs[b].append({"cpu": cpu, "wall": wall, "batch": measured["batch"], "rows": rows,
                            "threads": measured["threads"]})  # fmt: skip
            loads.append(os.getloadavg()[0])
    base = runs[batches[0]][0]["rows"]
    print(f"threads {args.threads}, {args.tokens} tokens in windows of {args.window}, load "
          f"average (1 min) {min(loads):.2f}-{max(loads):.2f}, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")  # fmt: skip
    print("| batch | CPU s | wall s | tokens/s | int4 perplexity | rel. diff | KL | top-1 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in batches:
        cpu = statistics.median(r["cpu"] for r in runs[b])
        wall = statistics.median(r["wall"] for r in runs[b])
        rows = runs[b][-1]["rows"]
        diffs = [abs(r[k] / w[k] - 1) for r, w in zip(rows, base, strict=True)
                 for k in ("perplexity", "kl_mean", "top1_agreement") if w[k]]  # fmt: skip
        print(f"| {runs[b][0]['batch']} | {cpu:.1f} | {wall:.1f} | "
              f"{2 * args.tokens / wall:.0f} | {rows[1]['perplexity']:.6f} | {max(diffs):.1e} | "
              f"{rows[1]['kl_mean']:.6f} | {rows[1]['top1_agreement']:.4f} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"loads": loads, "runs": runs, "threads": args.threads}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
