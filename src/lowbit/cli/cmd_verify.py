"""``lowbit verify DIR|FILE``: check a checkpoint on disk and say what it holds."""

from __future__ import annotations

import argparse
from typing import Any

from lowbit.checkpoints.verify import verify_checkpoint
from lowbit.cli import _common

_EPILOG = """\
What is checked:
  lowbit folder        lowbit.json's schema and digest, every file it records inside the
                       folder with its size and sha256, every array's dtype and shape, and
                       every tensor decoded
  compressed-tensors   config.json's quantization_config, the safetensors headers, and every
                       quantized weight's values, scale and zero point against its group
  GGUF file            the header, every tensor's type and extent inside the file
  other safetensors    the headers

Exit status 0 when the checkpoint passes; 2 with one line naming the file and the problem
when it does not. The sha256s detect corrupted or edited files; they are not a signature:
whoever can rewrite the files can rewrite lowbit.json too (docs/security.md).

examples:
  lowbit verify smol-int4                 a lowbit checkpoint, hashes and all
  lowbit verify smol-int4 --no-hash       sizes, schema and decoding only (faster)
  lowbit verify minilm-w8 --json          a compressed-tensors folder, as JSON
  lowbit verify smol.Q4_0.gguf
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check a checkpoint (lowbit, compressed-tensors, GGUF) and say what it holds",
        description="Check a checkpoint's files against its manifest or header, without "
        "building a model.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", metavar="DIR|FILE", help="checkpoint folder or file")
    p.add_argument(
        "--no-hash",
        action="store_true",
        help="skip the sha256 of the manifest and of every file (sizes are still checked)",
    )
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = verify_checkpoint(args.path, hashes=not args.no_hash)
    if args.json:
        _common.print_json({"ok": True, **report})
        return 0
    print(f"{report['kind']} checkpoint {report['path']}: OK ({report['tensors']:,} tensors)")
    for key, value in report["summary"].items():
        print(f"  {key}: {_common.fmt_num(value) if not isinstance(value, str) else value}")
    print()
    rows = [(f["file"], f["bytes"], f["sha256"]) for f in report["files"]]
    _common.print_table(rows, ["file", "bytes", "sha256"], align="lrl")
    print()
    print("checked: " + ", ".join(report["checks"]))
    return 0
