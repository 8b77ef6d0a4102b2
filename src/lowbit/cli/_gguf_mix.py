"""``lowbit quantize --to q4_k_m --out-format gguf``: llama-quantize's mixes, byte for byte.

The options llama-quantize users know (``--imatrix``, ``--tensor-type PATTERN=TYPE``,
``--output-tensor-type``, ``--token-embedding-type``, ``--pure``, ``--leave-output-tensor``) and
the run: types from :mod:`lowbit.ggml.mixes`, bytes from :mod:`lowbit.ggml.blocks`, the file
from :func:`lowbit.checkpoints.gguf.mix.write_gguf_mix`. ``--to q4_0`` and ``--to q8_0`` keep
lowbit's own plan (the linear weights only) unless one of these options asks for llama's mix.
``--method gptq`` GPTQs every linear layer the mix requantizes onto its block type
(:func:`lowbit.checkpoints.gguf.mix.gptq_targets`, ``lowbit.methods._ggml_gptq``); the others
are rounded as llama.cpp rounds them.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from lowbit.checkpoints.streaming import open_model
from lowbit.cli import _common
from lowbit.cli._calibrated import calibration_of
from lowbit.errors import LowbitError
from lowbit.ggml import mixes
from lowbit.jobs.gguf import gguf_mix
from lowbit.methods.gptq import GPTQ

_OWN_PLAN = {"Q4_0", "Q8_0"}  # lowbit's plan path writes these to GGUF (scheme "ggml")
# lowbit schemes too: with --out-format lowbit or compressed-tensors these are lowbit's own
# schemes (nvfp4: E4M3 group scales under a float32 tensor scale), with gguf the mix
_SCHEMES = {"Q4_0", "Q5_0", "Q8_0", "NVFP4"}
_MIX_FLAGS = ("imatrix", "tensor_type", "output_tensor_type", "token_embedding_type")


def add_options(p: argparse.ArgumentParser) -> None:
    """llama-quantize's options, for ``--to`` one of its mixes."""
    g = p.add_argument_group(
        "llama.cpp mixes (--to q2_k|q3_k_s|q3_k_m|q3_k_l|q4_k_s|q4_k_m|q5_k_s|q5_k_m|q6_k|"
        "iq4_nl|iq4_xs|q4_1|q5_0|q5_1|tq1_0|tq2_0 --out-format gguf, from a GGUF or a Hugging "
        "Face source (read as its converted GGUF, tensor by tensor, no temporary copy); "
        "--method gptq rounds the linear layers onto their block types with GPTQ)"
    )
    g.add_argument("--imatrix", metavar="FILE", help="llama.cpp importance matrix (GGUF or .dat)")
    g.add_argument(
        "--tensor-type",
        action="append",
        metavar="PATTERN=TYPE",
        help="type of the tensors whose name matches the regex (first match wins; repeatable)",
    )
    g.add_argument("--output-tensor-type", metavar="TYPE", help="type of output.weight")
    g.add_argument("--token-embedding-type", metavar="TYPE", help="type of token_embd.weight")
    g.add_argument("--pure", action="store_true", help="the mix's default type everywhere")
    g.add_argument(
        "--leave-output-tensor", action="store_true", help="keep output.weight as stored"
    )


def wanted(args: argparse.Namespace) -> bool:
    """Whether this run is a llama.cpp mix (else lowbit's plan path).

    Raises:
        LowbitError: a mix with a non-GGUF output, or mix options without a mix.
    """
    to = (args.to or "").strip()
    key = to.upper()
    is_mix = key in mixes.MIXES or key in ("Q3_K", "Q4_K", "Q5_K")
    if not is_mix and re.fullmatch(r"I?Q\d_K\w*|IQ\d_\w+|TQ\d_\w+", key):
        mixes.mix(to)  # a llama.cpp-style name that is no mix: say so, with the known ones
    flags = [f for f in _MIX_FLAGS if getattr(args, f, None)]
    flags += [f for f in ("pure", "leave_output_tensor") if getattr(args, f, False)]
    if is_mix and mixes.mix(key).default in ("F32", "F16", "BF16"):
        is_mix = False
    if not is_mix or args.out_format != "gguf":
        if flags:
            opts = ", ".join("--" + f.replace("_", "-") for f in flags)
            raise LowbitError(
                f"{opts}: llama.cpp mix options; use them with --to q4_k_m (or another "
                "llama.cpp mix) --out-format gguf"
            )
        if is_mix and key not in _SCHEMES:  # q4_0/q5_0/q8_0 are lowbit schemes as well
            raise LowbitError(
                f"--to {to} is llama.cpp's {mixes.mix(key).name} mix, which writes GGUF: add "
                "--out-format gguf"
            )
        return False
    if key in _OWN_PLAN and not flags:
        return False
    for flag in ("plan", "plan_preset", "group", "scale_method", "scale_format", "activations"):
        if getattr(args, flag, None):
            raise LowbitError(
                f"--{flag.replace('_', '-')} does not apply to llama.cpp's mixes (--to {to})"
            )
    if getattr(args, "method", "rtn") not in ("rtn", "gptq") or getattr(args, "asym", False):
        raise LowbitError(
            f"--to {to}: llama.cpp's mixes round as llama.cpp does, or with --method gptq "
            "onto the same grids"
        )
    if getattr(args, "smooth", None) is not None:
        raise LowbitError(f"--smooth does not apply to llama.cpp's mixes (--to {to})")
    return True


def _default_out(source: Path, mix: str) -> Path:
    stem = source.name.removesuffix(".gguf")
    stem = re.sub(r"\.(F32|F16|BF16|Q\d\w*)$", "", stem, flags=re.IGNORECASE)
    return Path(f"{stem}.{mix}.gguf")


def gptq_config(args: argparse.Namespace) -> GPTQ:
    """The GPTQ settings the options give."""
    return GPTQ(damp=args.damp, act_order=args.act_order, sequential=args.sequential)


def run(args: argparse.Namespace) -> int:
    """Write (or with --dry-run, show) the GGUF of llama-quantize's mix ``args.to``."""
    progress = False if args.no_progress or args.json else None
    m = mixes.mix(args.to.strip())
    ckpt = open_model(args.model)
    if args.out is not None and not args.out.strip():
        raise LowbitError("--out is empty; give the .gguf file to write")
    out = Path(args.out) if args.out else _default_out(Path(ckpt.path), m.name)
    gptq = getattr(args, "method", "rtn") == "gptq"
    res = gguf_mix(
        ckpt, m.name, out, imatrix=args.imatrix or None,
        method=gptq_config(args) if gptq else "rtn",
        calibration=calibration_of(args) if gptq else None,
        tensor_types=args.tensor_type or [], output_tensor_type=args.output_tensor_type,
        token_embedding_type=args.token_embedding_type, pure=args.pure,
        leave_output_tensor=args.leave_output_tensor, overwrite=args.overwrite,
        threads=args.threads, compute=_common.compute_option(args.compute), progress=progress,
        dry_run=args.dry_run, resume=True if getattr(args, "resume", False) else None,
    )  # fmt: skip
    if args.dry_run:
        return _print_types(args, res)
    result, record = res.details, res.method
    if args.json:
        _common.print_json(result)
        return 0
    types = ", ".join(f"{n} {t}" for t, n in result["types"].items())
    print(
        f"wrote {out} (GGUF, llama.cpp {m.name}, {result['bytes'] / 1e6:,.1f} MB) in "
        f"{result['seconds'] + (record or {}).get('seconds', {}).get('total', 0.0):.1f} s"
    )
    print(f"  {result['tensors']} tensors: {types}")
    if record is not None:
        print(
            f"  gptq onto the mix's grids: {record['gptq_tensors']} tensors, layer-output error "
            f"{record['mean_error']['gptq']:.4g} (llama.cpp's rounding "
            f"{record['mean_error']['rtn']:.4g}), importance: {record['importance']}"
        )
    if res.imatrix is not None:
        print(f"  importance matrix {args.imatrix}: {result['imatrix_tensors']} tensors used it")
    return 0


def _print_types(args: argparse.Namespace, res: Any) -> int:
    doc = res.details
    if args.json:
        _common.print_json(doc)
        return 0
    rows = [[r["name"], r["shape"], r["stored"], r["type"], r["bytes"]] for r in doc["tensors"]]
    _common.print_table(rows, ["tensor", "shape", "stored", "becomes", "bytes"], align="llllr")
    print(f"\n{Path(doc['source']).name} as llama.cpp {doc['mix']}: "
          f"{doc['tensor_bytes'] / 1e6:,.1f} MB of tensors. Dry run: nothing written.")  # fmt: skip
    return 0
