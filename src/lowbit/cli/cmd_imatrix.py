"""``lowbit imatrix``: llama.cpp's importance matrix of a GGUF model, from lowbit's calibration text."""

from __future__ import annotations

import argparse
from typing import Any

from lowbit._optional import require
from lowbit.calibration.data import Calibration
from lowbit.cli import _common
from lowbit.jobs.tasks import imatrix

_EPILOG = """\
The file is llama.cpp's GGUF importance matrix (NAME.in_sum2 / NAME.counts per weight, the
imatrix.* keys): llama-quantize --imatrix and lowbit quantize --imatrix read it.

examples:
  lowbit imatrix smollm2 --out smol.imatrix.gguf
  lowbit imatrix model.gguf --calib corpus.txt --calib-samples 64 --out imatrix.gguf
  lowbit quantize model.gguf --to q4_k_m --out-format gguf --imatrix imatrix.gguf --out m.gguf
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "imatrix",
        help="compute llama.cpp's importance matrix of a GGUF model on calibration text",
        description="Run a GGUF causal LM on calibration windows and write, per linear weight "
        "and input column, the sum of squared activations and the token count (llama.cpp's "
        "imatrix definition) as a GGUF importance matrix.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", nargs="?", metavar="MODEL", help="GGUF file or shipped model")
    p.add_argument("--out", metavar="FILE.gguf", required=True, help="the file to write")
    p.add_argument(
        "--calib",
        metavar="SRC",
        default="default",
        help="calibration data: default (lowbit's text from token 32,768), FILE.txt or FILE.jsonl",
    )
    p.add_argument("--calib-samples", type=int, help="windows (default 128)")
    p.add_argument("--calib-len", type=int, help="tokens per window (default 512)")
    p.add_argument(
        "--process-output", action="store_true", help="also collect the LM head (output.weight)"
    )
    p.add_argument("--threads", type=int, help="torch threads (default: the usable cores)")
    p.add_argument("--overwrite", action="store_true", help="replace a file lowbit wrote")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require("torch", extra="models", what="lowbit imatrix")
    require("transformers", extra="models", what="lowbit imatrix")
    calib = Calibration(source=args.calib, samples=args.calib_samples, length=args.calib_len)
    res = imatrix(
        args.model, args.out, calibration=calib, process_output=args.process_output,
        threads=args.threads, overwrite=args.overwrite,
        progress=False if args.no_progress or args.json else None,
    )  # fmt: skip
    result = res.details
    if args.json:
        _common.print_json(result)
        return 0
    print(
        f"wrote {result['path']}: importance matrix of {result['entries']} weights from "
        f"{result['chunks']} x {result['chunk_size']} tokens of {result['dataset']} in "
        f"{result['seconds']:.1f} s"
    )
    return 0
