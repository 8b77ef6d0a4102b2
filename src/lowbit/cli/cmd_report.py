"""``lowbit report DIR``: one self-contained HTML page about a quantized checkpoint."""

from __future__ import annotations

import argparse
from typing import Any

from lowbit.cli import _common
from lowbit.jobs.stopwatch import Stopwatch
from lowbit.jobs.tasks import report

_EPILOG = """\
DIR is a lowbit checkpoint folder (its lowbit.json names the source, whose tensors give the
errors), a compressed-tensors folder or a GGUF file (give --against SOURCE for errors).
The page has no external resources: open it offline, attach it to an issue.

It shows: a summary (source, size before/after, bits/weight with scales, formats, the plan
rules that fired, --eval results); each tensor's scheme (one colour per scheme, kept tensors
grey, a legend) and relative error on a layer x tensor grid, columns in the block's order
(q, k, v, o, gate, up, down, norms), one grid per expert kind for MoE checkpoints; for the
tensors with the largest error, a histogram of one scale group with the format's levels and
the error-vs-bits frontier of candidate schemes (int8:ch, fp8_e4m3:ch, int4:g128, int4:g32,
nf4, mxfp4, fp4:g32); the sensitivity of each tensor to each scheme
(--sensitivity, from `lowbit sensitivity --json`); a sortable table of every tensor.

examples:
  lowbit report smol-int4                          writes report.html
  lowbit report smol-int4 --out smol.html --png figs/
  lowbit report model-ct --against smollm2 --out ct.html
  lowbit report smol-int4 --eval eval.json --sensitivity sens.json --overwrite
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="an HTML page of where a quantized checkpoint's bits and errors are",
        description="Write one self-contained HTML page about a quantized checkpoint: "
        "bits and error per tensor across layers, the worst tensors in depth, a sortable table.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", metavar="DIR", help="the quantized checkpoint")
    p.add_argument(
        "--against",
        metavar="MODEL",
        help="the source model: a path or a shipped model (smollm2, minilm); default: "
        "lowbit.json's",
    )
    p.add_argument("--out", default="report.html", help="the HTML file (default report.html)")
    p.add_argument("--png", metavar="DIR", help="also write the figures as PNGs into DIR")
    p.add_argument("--eval", metavar="RESULTS.json", help="`lowbit eval --json` output to show")
    p.add_argument(
        "--sensitivity", metavar="FILE.json", help="`lowbit sensitivity --json` output to show"
    )
    p.add_argument(
        "--worst", type=int, default=3, help="tensors shown in depth (default 3; 0: none)"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an --out / --png file lowbit wrote"
    )
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    res = report(
        args.checkpoint, args.out, against=args.against or None, evaluation=args.eval or None,
        sensitivity=args.sensitivity or None, worst=args.worst, png=args.png or None,
        overwrite=args.overwrite,
    )  # fmt: skip
    d = res.details
    if args.json:
        _common.print_json(d)
        return 0
    print(f"wrote {args.out} ({d['tensors']} tensors) in {Stopwatch().line(d['seconds'])}")
    for p in d["png"]:
        print(f"wrote {p}")
    return 0
