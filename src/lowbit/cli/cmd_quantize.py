"""``lowbit quantize``: quantize a whole checkpoint with a precision plan, streaming."""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from lowbit.calibration.calibrated import calibrated_weights
from lowbit.checkpoints.quantize_model import open_model, output_nbytes, plan_model, quantize_model
from lowbit.checkpoints.readers import Checkpoint
from lowbit.cli import _budget, _common
from lowbit.cli._calibrated import (
    add_calibration_options,
    awq_run,
    calibration_of,
    method_summary,
)
from lowbit.errors import LowbitError
from lowbit.methods.gptq import GPTQ
from lowbit.plans.plan import AppliedPlan, PrecisionPlan
from lowbit.plans.rules import action_label, activation_format, calibrated_method, parse_action

_EPILOG = """\
MODEL is a .safetensors file, a Hugging Face folder, a .gguf file, or a shipped model:
smollm2 (SmolLM2-135M-Instruct, GGUF; the default) or minilm (all-MiniLM-L6-v2).

By default the 2-D weights of linear layers are quantized; embeddings, the LM head, norms,
biases and other 1-D tensors are kept as stored. A plan file (JSON or YAML) of ordered rules
changes that (see docs/quantize-models.md):

  rules:
    - {match: "*embed*", format: keep}
    - {component: mlp, ndim: 2, format: "nf4:g64", scale_method: mse}
    - {regex: 'model\\.layers\\.0\\..*proj\\.weight', format: "int8:ch"}

examples:
  lowbit quantize --to int4 --group 128 --dry-run            the plan for SmolLM2, no work
  lowbit quantize smollm2 --to int4 --group 128 --out smol-int4
  lowbit quantize minilm --to int8 --out-format compressed-tensors --out minilm-w8
  lowbit quantize smollm2 --to q4_0 --out-format gguf --out smol.Q4_0.gguf
  lowbit quantize model_dir --plan plan.yaml --to int4 --group 64 --asym --json
  lowbit quantize smollm2 --budget 4.5 --schemes int3:g128,int4:g128,int8:ch --out smol-mixed
  lowbit quantize smollm2 --budget 4.5 --sensitivity sens.json --eval --out smol-mixed
  lowbit quantize smollm2 --plan-preset q4_k_m_like --out smol-q4km-like
  lowbit quantize smollm2 --to int4:g128 --method awq --out smol-awq
  lowbit quantize minilm --to int4:g32 --method awq --out-format compressed-tensors --out m-awq
  lowbit quantize smollm2 --w8a8 int8 --smooth --out-format compressed-tensors --out smol-w8a8

Mixed precision: --budget BPW (stored bits per quantized weight, scales included) or --size
BYTES chooses one scheme per tensor from a sensitivity scan (lowbit sensitivity) so that the
summed measured damage is least within the budget; a --plan file's rules decide first. The
chosen plan is written beside the output as OUT.plan.json (lowbit quantize --plan reads it)
and printed with its predicted damage and the solver's optimality gap.

Output formats: lowbit (any scheme; lowbit.load / lowbit.load_model read it back),
compressed-tensors (int1..8 tensor/channel/group, fp8; vLLM serves it), gguf (Q8_0/Q4_0
from a GGUF source; llama.cpp runs it; --to q4_0 / q8_0 use llama.cpp's own rounding).
GPTQ, AWQ and SmoothQuant write all three (--smooth: not gguf), AWQ's and SmoothQuant's
folded norms and biases in place of the originals. Plan rules may say method: gptq or
method: awq (not both in one plan); such rules calibrate without --method.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "quantize",
        help="quantize a checkpoint (safetensors, HF folder, GGUF) with a precision plan",
        description="Quantize every tensor a precision plan names, one tensor at a time, and "
        "write a lowbit, compressed-tensors or GGUF checkpoint.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", nargs="?", metavar="MODEL", help="checkpoint or shipped model")
    p.add_argument(
        "--to",
        metavar="FORMAT",
        help="scheme for the linear weights: int8, int4, nf4, fp8_e4m3, mxfp4, q4_0, or a "
        "scheme string such as int4:g128:fp16 (no granularity: per output channel, NF4 in "
        "blocks of 64); bf16/fp16/fp32 alone are plain casts",
    )
    p.add_argument("--group", type=int, metavar="N", help="values per scale along each row")
    p.add_argument(
        "--scale-method",
        choices=["absmax", "percentile", "meanstd", "mse"],
        help="how each group's clipping range is chosen (default absmax)",
    )
    p.add_argument(
        "--asym", action="store_true", help="integer formats: add a zero point (floats: error)"
    )
    p.add_argument("--scale-format", metavar="F", help="scales in fp32 (default), fp16, bf16")
    p.add_argument(
        "--no-pad",
        action="store_true",
        help="a group size that does not divide a row is an error (default: shorter last group)",
    )
    p.add_argument(
        "--activations",
        metavar="FMT",
        help="declare per-token activation quantization (int8, fp8) for the quantized layers",
    )
    p.add_argument(
        "--w8a8",
        nargs="?",
        const="int8",
        choices=("int8", "fp8"),
        metavar="FMT",
        help="W8A8 (int8 or fp8, default int8): --activations FMT and, without --to or --plan, "
        "weights int8:ch or fp8_e4m3:ch; 8-bit --to schemes only",
    )
    p.add_argument("--plan", metavar="FILE", help="plan file (JSON/YAML) of ordered rules")
    p.add_argument(
        "--method",
        choices=["rtn", "gptq", "awq"],
        default="rtn",
        help="rtn: round to nearest (default); gptq, awq: calibrated (plan rules may name "
        "their own method)",
    )
    add_calibration_options(p, needs="--w8a8 or --activations")
    p.add_argument("--damp", type=float, default=0.01, help="gptq dampening (default 0.01)")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads of gptq/awq/--smooth and --eval (default: the usable cores; 1 on "
        "a machine shared with other work)",
    )
    p.add_argument("--out", metavar="PATH", help="output folder (or .gguf file)")
    p.add_argument(
        "--out-format",
        default="lowbit",
        choices=["lowbit", "compressed-tensors", "gguf"],
        help="what to write (default lowbit)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output that lowbit wrote (anything else is refused)",
    )
    p.add_argument(
        "--copy-code",
        action="store_true",
        help="also copy the source folder's .py files (custom model code); by default only "
        "config, tokenizer, chat template, README and licence files are copied",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan applied to the model")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--eval",
        action="store_true",
        help="measure the written checkpoint as lowbit eval does (mixed plans: predicted vs "
        "measured)",
    )
    _budget.add_options(p, calib=False)  # --calib* are GPTQ's options, the same data
    p.add_argument("--plot", metavar="OUT.png", help="mixed plans: bits per tensor across layers")
    _common.add_json(p)
    p.set_defaults(func=run)


def build_plan(args: argparse.Namespace) -> Any:
    """The precision plan the options describe (schemes through the one scheme parser);
    None when it is chosen from measurements or a preset (:mod:`lowbit.cli._budget`)."""
    _w8a8(args)
    _budget.check(args)
    if _budget.wanted(args) or args.plan_preset:
        given = [
            flag
            for flag, value in (
                ("--group", args.group),
                ("--scale-method", args.scale_method),
                ("--asym", True if args.asym else None),
                ("--scale-format", args.scale_format),
            )
            if value is not None
        ]
        if given:  # they modify --to, which neither takes whole (they were ignored before)
            where = (
                "the candidate schemes (e.g. --schemes int4:g128:asym:mse,int8:ch)"
                if _budget.wanted(args)
                else "--to (e.g. --to int4:g64:asym)"
            )
            raise LowbitError(f"{', '.join(given)}: write it into {where}")
        return None
    if args.to is None and args.plan is None:
        raise LowbitError(
            "say what to quantize to: --to FORMAT (e.g. int4 --group 128) or --plan FILE"
        )
    opts = {
        "group": args.group,
        "scale_method": args.scale_method,
        "asym": True if args.asym else None,
        "scale_format": args.scale_format,
    }
    if args.to is None and any(v is not None for v in opts.values()):
        raise LowbitError("--group, --scale-method, --asym and --scale-format modify --to FORMAT")
    if args.plan is None:
        return PrecisionPlan.uniform(
            args.to, pad=not args.no_pad, activations=args.activations, **opts
        )
    plan = PrecisionPlan.from_file(args.plan)
    if args.to is not None:
        plan = plan.with_default(
            parse_action(
                args.to,
                group_size=args.group,
                scale_method=args.scale_method,
                symmetric=False if args.asym else None,
                scale_format=args.scale_format,
                pad=False if args.no_pad else None,
            )
        )
    if args.activations:
        plan = plan.with_default(plan.default, activation_format(args.activations))
    return plan


_W8A8 = {"int8": ("int8", "int8:ch"), "fp8": ("float8_e4m3fn", "fp8_e4m3:ch")}


def _w8a8(args: argparse.Namespace) -> None:
    """``--w8a8 FMT``: the same as ``--activations FMT`` and, when neither ``--to`` nor
    ``--plan`` says what the weights become, ``--to int8:ch`` / ``fp8_e4m3:ch``.

    Raises:
        LowbitError: ``--activations`` of another format, or a ``--to`` that is not 8-bit.
    """
    if args.w8a8 is None:
        return
    act, weights = _W8A8[args.w8a8]
    if args.activations is not None and activation_format(args.activations) != act:
        raise LowbitError(
            f"--w8a8 {args.w8a8} declares {act} activations, --activations {args.activations} "
            "contradicts it: give one of them"
        )
    if args.to is not None:
        to = parse_action(args.to, group_size=args.group)
        bits = getattr(getattr(to, "element_format", None), "bits", None)
        if bits != 8:
            raise LowbitError(
                f"--w8a8 means 8-bit weights, but --to {args.to} is {action_label(to)}: drop "
                f"--to (W8A8 weights are {weights}) or give --activations {args.w8a8} for "
                f"{action_label(to)} weights with {args.w8a8} activations"
            )
    elif args.plan is None and not args.plan_preset and not _budget.wanted(args):
        args.to = weights
    args.activations = args.w8a8


def _gptq(
    args: argparse.Namespace, ckpt: Any, plan: Any, out: Path, progress: bool | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """GPTQ's weights and what to record about them (``--method gptq``)."""

    if out.exists() and not args.overwrite:  # fail before minutes of calibration
        raise LowbitError(f"{out} exists; pass --overwrite to replace it")
    cfg = GPTQ(damp=args.damp, act_order=args.act_order, sequential=args.sequential)
    calib = calibration_of(args)
    run = calibrated_weights(
        ckpt, plan, cfg, calib, default_method=args.method, threads=args.threads,
        progress=progress,
    )  # fmt: skip
    return run.weights, run.record


def _default_out(source: Path, args: argparse.Namespace) -> Path:
    stem = source.name
    for suffix in (".gguf", ".safetensors"):
        stem = stem.removesuffix(suffix)
    tag = args.to or ("mixed-" + (args.budget or args.size) if _budget.wanted(args) else None)
    tag = tag or args.plan_preset or "plan"
    if args.group:
        tag += f"-g{args.group}"
    if args.asym:
        tag += "-asym"
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", tag).strip("-")
    name = f"{stem}-{tag}" + (".gguf" if args.out_format == "gguf" else "")
    return Path(name)


def _out_path(args: argparse.Namespace, ckpt: Any) -> Path:
    return Path(args.out) if args.out else _default_out(ckpt.path, args)


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f} MB"


def run(args: argparse.Namespace) -> int:
    progress = False if args.no_progress or args.json else None
    if args.threads is not None and args.threads < 1:
        raise LowbitError(f"--threads must be >= 1, got {args.threads}")
    plan = build_plan(args)
    ckpt = open_model(args.model)
    mixed = scan = None
    if plan is None and args.plan_preset:
        plan = _budget.preset(args, ckpt)
    elif plan is None:
        if not args.dry_run:
            _budget.precheck(args, ckpt, _out_path(args, ckpt))
        mixed, scan = _budget.solve(args, ckpt, progress)
        plan = mixed.plan
    rounding = "llama.cpp" if (args.to or "").strip().lower() in ("q4_0", "q8_0") else "auto"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        applied = plan_model(ckpt, plan, out_format=args.out_format, gguf_rounding=rounding)
    _print_warnings(args, caught)
    sizes = [output_nbytes(t, args.out_format) for t in applied.tensors]
    totals = applied.totals()
    totals["out_bytes"] = sum(sizes)
    if args.dry_run and mixed is not None:
        return _budget.print_dry_run(args, ckpt, mixed, scan)
    if args.dry_run:
        return _print_plan(args, ckpt, applied, sizes, totals)
    if args.out is not None and not args.out.strip():
        raise LowbitError("--out is empty; give a folder (or .gguf file) to write")
    out = Path(args.out) if args.out is not None else _default_out(ckpt.path, args)
    done = method = None
    source = ckpt
    # rule methods run their method without --method; gptq and awq never mix (one run)
    named = calibrated_method([t.method for t in applied.quantized], args.method)
    if args.smooth is not None or "awq" in (args.method, named):
        source, done, method = awq_run(args, ckpt, plan, applied, out, progress)
    elif "gptq" in (args.method, named):
        done, method = _gptq(args, ckpt, plan, out, progress)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = quantize_model(
            source,
            plan,
            out,
            out_format=args.out_format,
            gguf_rounding=rounding,
            overwrite=args.overwrite,
            copy_code=args.copy_code,
            progress=progress,
            weights=done,
            method=method,
        )
    if method is not None:
        result["method"] = method
    _print_warnings(args, [w for w in caught if "matches no tensor" not in str(w.message)])
    extra = _budget.after_write(args, ckpt, mixed, scan, out, progress)
    if args.json:
        _common.print_json({**result, **extra})
        return 0
    t = result["totals"]
    what = {"lowbit": "lowbit checkpoint", "compressed-tensors": "compressed-tensors checkpoint",
            "gguf": "GGUF file"}[args.out_format]  # fmt: skip
    print(f"wrote {out} ({what}, {_mb(result['bytes'])}) in {result['seconds']:.1f} s")
    if method is not None:
        print(f"  {method_summary(method)}")
    print(f"  {_summary(applied, sizes, t)}")
    _print_files(result)
    if args.out_format == "lowbit":
        model = args.model or "smollm2"
        print(f"  evaluate: lowbit eval {model} {out}    load: lowbit.load_model({str(out)!r})")
    _budget.print_after(args, ckpt, mixed, scan, extra)
    return 0


def _summary(applied: Any, sizes: list[int], t: dict[str, Any]) -> str:
    """One line: what was quantized, cast and kept, each with its output size."""
    parts = []
    for action, verb in (("quantize", "quantized to"), ("cast", "cast to")):
        rows = [(p, s) for p, s in zip(applied.tensors, sizes, strict=True) if p.action == action]
        if not rows:
            continue
        labels = ", ".join(sorted({p.label for p, _ in rows}))
        bpw = (
            f", {t['bits_per_weight']:.3f} bits/weight"
            if action == "quantize" and t["bits_per_weight"]
            else ""
        )
        parts.append(f"{len(rows)} {verb} {labels} ({_mb(sum(s for _, s in rows))}{bpw})")
    kept = [s for p, s in zip(applied.tensors, sizes, strict=True) if p.action == "keep"]
    if kept:
        parts.append(f"{len(kept)} kept at source precision ({_mb(sum(kept))})")
    return f"{t['tensors']} tensors: {'; '.join(parts)}; source {_mb(t['source_bytes'])}"


def _print_files(result: dict[str, Any]) -> None:
    """One line each: what was copied from the source folder, what was left out and why."""
    if result["copied_files"]:
        print(f"  copied: {', '.join(result['copied_files'])}")
    left = result["left_out"]
    if left:
        shown = "; ".join(f"{e['file']} ({e['why']})" for e in left[:6])
        more = f"; and {len(left) - 6} more (--json lists them)" if len(left) > 6 else ""
        print(f"  left out: {shown}{more}")


def _print_warnings(args: argparse.Namespace, caught: list[Any]) -> None:
    for w in caught:
        print(f"lowbit {args.command}: warning: {w.message}", file=sys.stderr)


def _print_plan(
    args: argparse.Namespace,
    ckpt: Checkpoint,
    applied: AppliedPlan,
    sizes: list[int],
    totals: dict[str, Any],
) -> int:
    if args.json:
        doc = applied.to_dict()
        for row, size in zip(doc["tensors"], sizes, strict=True):
            row["out_bytes"] = size
        doc.update(source=str(ckpt.path), source_format=ckpt.format, out_format=args.out_format)
        doc["totals"] = totals
        _common.print_json(doc)
        return 0
    rows = []
    for t, size in zip(applied.tensors, sizes, strict=True):
        rows.append(
            [
                t.name,
                "x".join(str(s) for s in t.shape),
                t.dtype,
                t.label + (f" +{t.activations} act" if t.activations else ""),
                f"{size * 8 / t.numel:.3f}" if t.numel else "-",
                size,
                t.reason,
            ]
        )
    _common.print_table(
        rows, ["tensor", "shape", "stored", "becomes", "bits", "bytes", "why"], align="lllllrl"
    )
    bpw = totals["bits_per_weight"]
    print(
        f"\n{ckpt.path.name}: {totals['quantized']} of {totals['tensors']} tensors quantized "
        f"({totals['quantized_params']:,} of {totals['params']:,} values"
        + (f", {bpw:.3f} bits/weight in lowbit's layout" if bpw else "")
        + f"), {totals['kept']} kept, {totals['cast']} cast; {args.out_format} output "
        f"{_mb(totals['out_bytes'])} from {_mb(totals['source_bytes'])}. Dry run: nothing written."
    )
    return 0
