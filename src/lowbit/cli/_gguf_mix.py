"""``lowbit quantize --to q4_k_m --out-format gguf``: llama-quantize's mixes, byte for byte.

The options llama-quantize users know (``--imatrix``, ``--tensor-type PATTERN=TYPE``,
``--output-tensor-type``, ``--token-embedding-type``, ``--pure``, ``--leave-output-tensor``) and
the run: types from :mod:`lowbit.ggml.mixes`, bytes from :mod:`lowbit.ggml.blocks`, the file
from :func:`lowbit.checkpoints.gguf_mix.write_gguf_mix`. ``--to q4_0`` and ``--to q8_0`` keep
lowbit's own plan (the linear weights only) unless one of these options asks for llama's mix.
``--method gptq`` GPTQs every linear layer the mix requantizes onto its block type
(:func:`lowbit.checkpoints.gguf_mix.gptq_targets`, ``lowbit.methods._ggml_gptq``); the others
are rounded as llama.cpp rounds them.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.calibration.gptq import gptq_weights
from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints._outputs import check_output
from lowbit.checkpoints._scratch import scratch_dir
from lowbit.checkpoints.gguf_convert import check_hf_source
from lowbit.checkpoints.gguf_mix import gguf_mix_types, gptq_targets, write_gguf_mix
from lowbit.checkpoints.imatrix import read_imatrix
from lowbit.checkpoints.quantize_model import check_unrotated, open_model, quantize_model
from lowbit.cli import _common
from lowbit.cli._calibrated import calibration_of
from lowbit.errors import LowbitError
from lowbit.ggml import blocks, mixes
from lowbit.methods.gptq import GPTQ
from lowbit.plans.plan import PrecisionPlan

#: The name a Hugging Face model converted to a temporary GGUF is written under (beside --out).
HF_TO_GGUF_PREFIX = ".lowbit-hf-to-gguf-"
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
        "Face source (converted first, into a temporary file beside the output); "
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


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = []
    for item in args.tensor_type or []:
        pattern, sep, typ = item.partition("=")
        if not sep or not pattern or not typ:
            raise LowbitError(f"--tensor-type {item!r}: write PATTERN=TYPE (e.g. attn_v=q8_0)")
        pairs.append((pattern.lower(), typ))
    return {
        "tensor_types": pairs,
        "output_tensor_type": args.output_tensor_type,
        "token_embedding_type": args.token_embedding_type,
        "pure": args.pure,
        "leave_output_tensor": args.leave_output_tensor,
    }


def _default_out(source: Path, mix: str) -> Path:
    stem = source.name.removesuffix(".gguf")
    stem = re.sub(r"\.(F32|F16|BF16|Q\d\w*)$", "", stem, flags=re.IGNORECASE)
    return Path(f"{stem}.{mix}.gguf")


def run(args: argparse.Namespace) -> int:
    """Write (or with --dry-run, show) the GGUF of llama-quantize's mix ``args.to``."""
    progress = False if args.no_progress or args.json else None
    m = mixes.mix(args.to.strip())
    ckpt = open_model(args.model)
    check_unrotated(ckpt)
    imatrix = read_imatrix(args.imatrix) if args.imatrix else None
    options = _overrides(args)
    if args.out is not None and not args.out.strip():
        raise LowbitError("--out is empty; give the .gguf file to write")
    out = Path(args.out) if args.out else _default_out(Path(ckpt.path), m.name)
    if not args.dry_run:  # before a conversion: a bad --out fails at once
        check_output(out, overwrite=args.overwrite, kind="file", inputs=[ckpt.path])
    with gguf_source(ckpt, out, progress) as source:
        return _run_mix(args, source, m, imatrix, options, out, progress)


@contextlib.contextmanager
def gguf_source(ckpt: Any, out: Path, progress: bool | None) -> Iterator[Any]:
    """``ckpt`` itself when it is a GGUF; a Hugging Face source converted first (lowbit's
    ``convert_hf_to_gguf``: llama.cpp's tensors and keys, each tensor at the precision it is
    stored in) into a temporary GGUF beside ``out``, as llama.cpp users do in two steps. The
    temporary file is removed when the block ends, also on error; one a killed run left
    there is removed by the next (with a warning).

    Raises:
        LowbitError: a family or tokenizer lowbit cannot convert.
    """
    if ckpt.format == "gguf":
        yield ckpt
        return
    check_hf_source(ckpt)
    parent = out.parent if str(out.parent) else Path(".")
    where = parent if parent.is_dir() else None  # a dry run may name a folder yet to exist
    # marked and locked: a killed run's folder (a converted copy of the model) is removed by
    # the next run here (lowbit.checkpoints._scratch)
    with scratch_dir(HF_TO_GGUF_PREFIX, where) as tmp:
        src = Path(tmp) / (Path(ckpt.path).name + ".gguf")
        keep = PrecisionPlan.from_dict({"rules": [{"match": "*", "format": "keep"}]})
        quantize_model(ckpt, keep, src, out_format="gguf", progress=progress)
        ckpt.close()
        with open_checkpoint(src) as converted:
            yield converted


def _run_mix(
    args: argparse.Namespace,
    ckpt: Any,
    m: Any,
    imatrix: Any,
    options: dict[str, Any],
    out: Path,
    progress: bool | None,
) -> int:
    if args.dry_run:
        types = gguf_mix_types(ckpt, m.name, has_imatrix=imatrix is not None, **options)
        return _print_types(args, ckpt, m, types)
    done, record = None, None
    if getattr(args, "method", "rtn") == "gptq":
        done, record = _gptq(args, ckpt, m.name, imatrix, options, out, progress)
    result = write_gguf_mix(
        ckpt, out, m.name, imatrix=imatrix, overwrite=args.overwrite, progress=progress,
        weights=done, **options,
    )  # fmt: skip
    if record is not None:
        result["method"] = record
    if args.imatrix:
        result["imatrix"] = str(args.imatrix)
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
    if imatrix is not None:
        print(f"  importance matrix {args.imatrix}: {result['imatrix_tensors']} tensors used it")
    return 0


def _gptq(
    args: argparse.Namespace,
    ckpt: Any,
    mix_name: str,
    imatrix: Any,
    options: dict[str, Any],
    out: Path,
    progress: bool | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--method gptq``: GPTQ of every linear layer the mix requantizes, onto its block type."""
    if out.exists() and not args.overwrite:  # fail before minutes of calibration
        raise LowbitError(f"{out} exists; pass --overwrite to replace it")
    targets = gptq_targets(ckpt, mix_name, imatrix=imatrix, **options)
    return gptq_onto(args, ckpt, targets, imatrix is not None, progress)


def gptq_onto(
    args: argparse.Namespace,
    ckpt: Any,
    targets: dict[str, Any],
    importance: bool,
    progress: bool | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """GPTQ of ``targets`` (tensor -> :class:`~lowbit.methods._ggml_gptq.GgmlTarget`) with the
    options' calibration: the GGUF blocks of the tensors it rounded, and its record."""
    cfg = GPTQ(damp=args.damp, act_order=args.act_order, sequential=args.sequential)
    compute = _common.compute_option(args.compute)
    run = gptq_weights(
        ckpt, None, calibration_of(args), cfg, threads=args.threads, progress=progress,
        compute=compute, targets=targets,
    )  # fmt: skip
    done = {n: w for n, w in run.weights.items() if run.methods.get(n) == "gptq"}
    errs = [run.layers[n] for n in done if n in run.layers]
    mean = {k: float(np.mean([e[k] for e in errs])) if errs else 0.0 for k in ("rtn", "gptq")}
    record = {
        **cfg.to_dict(),
        "gptq_tensors": len(done),
        "importance": "importance matrix" if importance else "diag(H)",
        "mean_error": mean,
        "layers": run.layers,
        "calibration": run.calibration,
        "seconds": run.seconds,
    }
    return done, record


def _print_types(args: argparse.Namespace, ckpt: Any, m: Any, types: dict[str, str]) -> int:
    rows, total = [], 0
    for name in ckpt.names():
        info = ckpt.info(name)
        t = types[name]
        nbytes = info.nbytes if t == info.dtype.upper() else _nbytes(info.shape, t)
        total += nbytes
        rows.append([name, "x".join(map(str, info.shape)), info.dtype, t, nbytes])
    if args.json:
        _common.print_json(
            {
                "source": str(ckpt.path),
                "mix": m.name,
                "file_type": m.file_type,
                "tensors": [
                    dict(zip(("name", "shape", "stored", "type", "bytes"), r, strict=False))
                    for r in rows
                ],
                "tensor_bytes": total,
            }
        )
        return 0
    _common.print_table(rows, ["tensor", "shape", "stored", "becomes", "bytes"], align="llllr")
    print(f"\n{Path(ckpt.path).name} as llama.cpp {m.name}: {total / 1e6:,.1f} MB of tensors. "
          "Dry run: nothing written.")  # fmt: skip
    return 0


def _nbytes(shape: tuple[int, ...], t: str) -> int:
    if t in ("F32", "F16", "BF16"):
        n = 1
        for d in shape:
            n *= d
        return n * (4 if t == "F32" else 2)
    return blocks.nbytes(tuple(shape), t) if t in blocks.TYPES else 0
