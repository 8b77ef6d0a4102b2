"""``lowbit report DIR``: one self-contained HTML page about a quantized checkpoint."""

from __future__ import annotations

import argparse
from typing import Any

from lowbit import _json
from lowbit.checkpoints.io.outputs import check_output, output_file
from lowbit.checkpoints.streaming import resolve_model
from lowbit.cli import _common
from lowbit.errors import LowbitError
from lowbit.jobs.stopwatch import Stopwatch
from lowbit.view.html import render
from lowbit.view.png import write_pngs
from lowbit.view.report import build_report

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


def _read_json(path: str, flag: str) -> Any:
    try:  # bounded size and depth, regular files only (a FIFO hung, 10^5 brackets recursed)
        return _json.load(path)
    except LowbitError as exc:
        raise LowbitError(f"{flag} {exc}") from None


def run(args: argparse.Namespace) -> int:
    clock = Stopwatch()
    if args.worst < 0:
        raise LowbitError(f"--worst must be >= 0, got {args.worst}")
    if args.against:  # a shipped model's name (smollm2, minilm) as `lowbit quantize` takes
        args.against = str(resolve_model(args.against))
    inputs = [args.checkpoint] + ([args.against] if args.against else [])
    check_output(args.out, overwrite=args.overwrite, inputs=inputs)
    evaluation = _read_json(args.eval, "--eval") if args.eval else None
    sens = _read_json(args.sensitivity, "--sensitivity") if args.sensitivity else None
    if sens is not None and not isinstance(sens, dict):
        raise LowbitError(f"--sensitivity {args.sensitivity}: not a lowbit sensitivity result")
    with clock.part("tensors"):  # reading and measuring each tensor, then the candidates
        report = build_report(
            args.checkpoint,
            against=args.against,
            evaluation=evaluation,
            sensitivity=sens,
            worst=args.worst,
        )
    clock.split("tensors", {"candidates": report.seconds.get("details", 0.0)})
    with clock.part("page"):
        page = render(report)
        with output_file(args.out, overwrite=args.overwrite, inputs=inputs) as tmp:
            tmp.write_text(page, encoding="utf-8")
    pngs = []
    if args.png:
        with clock.part("png"):
            pngs = [str(p) for p in write_pngs(report, args.png, overwrite=args.overwrite)]
    seconds = clock.to_dict()
    if args.json:
        _common.print_json({"out": args.out, "png": pngs, "seconds": seconds,
                            "tensors": len(report.rows)})  # fmt: skip
        return 0
    print(f"wrote {args.out} ({len(report.rows)} tensors) in {clock.line(seconds)}")
    for p in pngs:
        print(f"wrote {p}")
    return 0
