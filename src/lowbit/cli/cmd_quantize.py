"""``lowbit quantize``: quantize a whole checkpoint with a precision plan, streaming."""

from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path
from typing import Any

from lowbit._workers_cap import check_workers
from lowbit.checkpoints.streaming import (
    check_unrotated,
    open_model,
    output_nbytes,
    plan_model,
)
from lowbit.cli import _budget, _common, _gguf_budget, _gguf_mix, _mlx
from lowbit.cli._calibrated import (
    add_calibration_options,
    calibration_of,
    method_summary,
)
from lowbit.cli._quantize_report import _mb, _print_files, _print_plan, _print_warnings, _summary
from lowbit.errors import LowbitError
from lowbit.jobs import rotation
from lowbit.jobs.quantize import quantize_plan
from lowbit.jobs.stopwatch import Stopwatch
from lowbit.methods.awq import AWQ
from lowbit.methods.gptq import GPTQ
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import action_label, activation_format, parse_action

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
  lowbit quantize model.gguf --to q4_k_m --out-format gguf --imatrix imatrix.gguf --out m.gguf
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
compressed-tensors (int1..8 tensor/channel/group, fp8; vLLM serves it), gguf (Q8_0/Q4_0,
or bf16/f16/f32, from a GGUF source or a Hugging Face llama/mistral/mixtral/qwen2/qwen3/
qwen2_moe/qwen3_moe/gemma2/gemma3/phi3 folder, converted as llama.cpp's convert_hf_to_gguf.py does; llama.cpp
runs it; --to q4_0 / q8_0 use llama.cpp's own rounding; --to q2_k..q6_k, q3_k_m, q4_k_m,
q5_k_m, iq4_xs, ... (a Hugging Face folder converted first) choose every tensor's type as
llama-quantize's mix of that name and write llama.cpp's bytes, with --imatrix used as
llama-quantize uses it;
with --method gptq the mix's linear layers are GPTQ'd onto their block types, each block's
scales from llama.cpp's search, importance from --imatrix or else the Hessian's diagonal).
GPTQ, AWQ and SmoothQuant write all three (--smooth: not gguf), AWQ's and SmoothQuant's
folded norms and biases in place of the originals; --smooth --method gptq runs GPTQ on the
SmoothQuant-folded model. Plan rules may say method: gptq or
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
        "blocks of 64); bf16/fp16/fp32 alone are plain casts; with --out-format gguf also a "
        "llama.cpp mix (q4_k_m, q5_k_s, iq4_xs, ...: every tensor as llama-quantize does it)",
    )
    p.add_argument("--group", type=int, metavar="N", help="values per scale along each row")
    p.add_argument(
        "--scale-method",
        choices=["absmax", "percentile", "meanstd", "mse"],
        help="how each group's clipping range is chosen (default absmax; with --out-format mlx "
        "--method gptq: mse, the default, searches each group's scale and bias for the least "
        "Hessian-weighted error, absmax takes MLX's edge rule)",
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
        help="declare the quantized layers' input quantization: per token (int8, fp8), or "
        "nvfp4 (W4A4: with --to nvfp4 and --out-format compressed-tensors; each layer's "
        "static input_global_scale calibrated on the --calib text)",
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
        choices=["rtn", "gptq", "awq", *rotation.ROTATING, *rotation.FOLDING],
        default="rtn",
        help="rtn: round to nearest (default); gptq, awq: calibrated (plan rules may name "
        "their own method); hadamard, hadamard+gptq (MR-GPTQ): weights stored in the block-"
        "Hadamard-rotated basis, the rotation the inputs need recorded (lowbit: for "
        "lowbit.load_model/eval; compressed-tensors: transform_config, for vLLM; no GGUF); "
        "hadamard-fold, hadamard-fold+gptq: the rotation folded offline into "
        "attention's v -> o projections (exact, nothing to rotate at run time: every format), "
        "then rounded to nearest or GPTQ'd",
    )
    add_calibration_options(p, needs="--w8a8 or --activations")  # and nvfp4's input scales
    p.add_argument("--damp", type=float, default=0.01, help="gptq dampening (default 0.01)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="gptq: continue from the record a stopped run left beside --out "
        "(.OUT.lowbit-resume, kept after every block); without --resume a matching record is "
        "used too and one that does not match is replaced with a warning; with it, no usable "
        "record is an error",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads of gptq/awq/--smooth and --eval (default: the usable cores; 1 on "
        "a machine shared with other work)",
    )
    _common.add_compute(p, "the model passes of gptq, awq, --smooth and --eval")
    p.add_argument("--out", metavar="PATH", help="output folder (or .gguf file)")
    p.add_argument(
        "--out-format",
        default="lowbit",
        choices=["lowbit", "compressed-tensors", "gguf", "mlx"],
        help="what to write (default lowbit; mlx: an mlx-lm folder, see --q-bits)",
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
    # --calib* are GPTQ's options, the same data; --measure's default depends on the output
    _budget.add_options(p, calib=False, measure=None)
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="mixed plans: each tensor's scheme across layers, in lowbit report's colours",
    )
    _gguf_mix.add_options(p)
    _mlx.add_options(p)
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
        "group_size": args.group,
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


def run(args: argparse.Namespace) -> int:
    if _mlx.wanted(args):
        return _mlx.run(args)
    if _gguf_budget.wanted(args):
        return _gguf_budget.run(args)
    if _gguf_mix.wanted(args):
        return _gguf_mix.run(args)
    clock = Stopwatch()
    progress = False if args.no_progress or args.json else None
    if args.threads is not None and args.threads < 1:
        raise LowbitError(f"--threads must be >= 1, got {args.threads}")
    check_workers(args.workers, "--workers")
    args.compute = _common.compute_option(args.compute)
    plan = build_plan(args)
    w4a4 = activation_format(args.activations) == "nvfp4"
    if w4a4 and args.out_format != "compressed-tensors":
        raise LowbitError(
            "--activations nvfp4 (W4A4) is written as compressed-tensors' input_global_scale: "
            "add --out-format compressed-tensors (with --to nvfp4)"
        )
    ckpt = open_model(args.model)
    check_unrotated(ckpt)
    mixed = scan = None
    if plan is None and args.plan_preset:
        plan = _budget.preset(args, ckpt)
    elif plan is None:
        if not args.dry_run:
            _budget.precheck(args, ckpt, _out_path(args, ckpt))
        with clock.part("plan"):  # the sensitivity scan (unless --sensitivity) and the solver
            mixed, scan = _budget.solve(args, ckpt, progress)
        plan = mixed.plan
    rounding = "llama.cpp" if (args.to or "").strip().lower() in ("q4_0", "q8_0") else "auto"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        applied = plan_model(ckpt, plan, out_format=args.out_format, gguf_rounding=rounding)
    _print_warnings(args, caught)
    shown = {str(w.message) for w in caught}
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
    gptq = GPTQ(damp=args.damp, act_order=args.act_order, sequential=args.sequential)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = quantize_plan(
            ckpt, plan, out, name=args.method, gptq=gptq, awq=AWQ(clip=not args.no_clip),
            smooth=args.smooth, out_format=args.out_format, calib=calibration_of(args),
            threads=args.threads, compute=args.compute, workers=args.workers, ray=args.ray,
            overwrite=args.overwrite, copy_code=args.copy_code, max_shard_size=None,
            progress=progress, dry_run=False, rounding=rounding, clock=clock,
            resume=True if args.resume else None,
        )  # fmt: skip
    result = dict(res.details)
    method = res.method
    inputs = result.get("input_scales")
    fold = (method or {}).get("fold")
    _print_warnings(args, [w for w in caught if "matches no tensor" not in str(w.message)
                           and str(w.message) not in shown])  # fmt: skip
    with clock.part("eval" if args.eval else "other"):  # --eval; the plan file, --plot
        extra = _budget.after_write(args, ckpt, mixed, scan, out, progress)
    result["seconds"] = clock.to_dict()  # the whole command, by part
    if args.json:
        _common.print_json({**result, **extra})
        return 0
    t = result["totals"]
    what = {"lowbit": "lowbit checkpoint", "compressed-tensors": "compressed-tensors checkpoint",
            "gguf": "GGUF file"}[args.out_format]  # fmt: skip
    print(f"wrote {out} ({what}, {_mb(result['bytes'])}) in {clock.line(result['seconds'])}")
    if method is not None and method.get("method") not in ("hadamard", "rtn"):
        print(f"  {method_summary(method)}")
    if inputs is not None:
        r = inputs
        print(
            f"  NVFP4 input scales (input_global_scale) of {r['layers']} layers, "
            f"{r['fused_groups']} fused groups sharing one, from {r['calibration']['described']}: "
            f"{r['seconds']:.0f} s"
        )
    if (method or {}).get("rotation"):
        n = len(result["method"]["rotation"]["tensors"])
        print(f"  {n} tensors stored block-Hadamard-rotated (their inputs rotated online)")
    if fold is not None:
        print(f"  block-Hadamard rotation ({fold['block']}) folded into {fold['pairs']} "
              "attention v -> o projection pairs (exact; nothing to rotate at run time)")  # fmt: skip
    print(f"  {_summary(applied, sizes, t)}")
    _print_files(result)
    if args.out_format == "lowbit":
        model = args.model or "smollm2"
        print(f"  evaluate: lowbit eval {model} {out}    load: lowbit.load_model({str(out)!r})")
    _budget.print_after(args, ckpt, mixed, scan, extra)
    return 0
