"""``lowbit quantize MODEL --out-format mlx``: an MLX folder for mlx-lm, in its own words.

The options are ``mlx_lm.convert``'s: ``--q-bits``, ``--q-group-size``, ``--q-mode`` (affine, mxfp4, mxfp8,
nvfp4; alone: affine, 4 bits, groups of 64, ``mlx_lm.convert -q``'s default), ``--dtype``, and
``--to`` one of mlx-lm's mixed recipes (``mixed_2_6``, ``mixed_3_4``, ``mixed_3_6``,
``mixed_4_6``) or an MLX mode name; or ``--budget BPW`` / ``--size BYTES`` with ``--candidates``
grids, each trial measured by the model or (``--measure block``) by its block
(``lowbit.jobs.mlx_budget``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.checkpoints.mlx.writer import MLX_DTYPES
from lowbit.checkpoints.streaming import resolve_model
from lowbit.cli import _common
from lowbit.cli._calibrated import calibration_of
from lowbit.cli._gguf_mix import gptq_config
from lowbit.cli._scan import scan_windows
from lowbit.errors import LowbitError
from lowbit.jobs.mlx import METHODS, mlx_params, quantize_to_mlx
from lowbit.jobs.mlx_budget import mlx_budget
from lowbit.methods.awq import AWQ
from lowbit.methods.gptq import GPTQ
from lowbit.plans.mixed import parse_size
from lowbit.quant.mlx import MODES

# options of lowbit's plan path that an MLX run would silently ignore
_NOT_MLX = (
    ("plan", "--plan"), ("plan_preset", "--plan-preset"), ("group", "--group (use --q-group-size)"),
    ("scale_format", "--scale-format"), ("asym", "--asym"),
    ("activations", "--activations"), ("w8a8", "--w8a8"), ("smooth", "--smooth"),
    ("eval", "--eval (run lowbit eval on the folder)"), ("plot", "--plot"),
    ("sensitivity", "--sensitivity"), ("min_format", "--min-format"),
)  # fmt: skip


def add_options(p: argparse.ArgumentParser) -> None:
    """``mlx_lm.convert``'s quantization options, for ``--out-format mlx``."""
    g = p.add_argument_group("MLX output (--out-format mlx), as mlx_lm.convert spells them")
    g.add_argument("--q-bits", type=int, metavar="N", help="bits per weight (affine: 1-6, 8)")
    g.add_argument("--q-group-size", type=int, metavar="N", help="affine groups: 32, 64, 128")
    g.add_argument("--q-mode", choices=list(MODES), help="affine (default), mxfp4, mxfp8, nvfp4")
    g.add_argument("--dtype", choices=list(MLX_DTYPES), help="model dtype (default: config.json's)")


def wanted(args: argparse.Namespace) -> bool:
    """Whether this run writes MLX.

    Raises:
        LowbitError: MLX options without ``--out-format mlx``.
    """
    mlx_flags = [f for f in ("q_bits", "q_group_size", "q_mode", "dtype") if getattr(args, f, None)]
    if args.out_format != "mlx":
        if mlx_flags:
            opts = ", ".join("--" + f.replace("_", "-") for f in mlx_flags)
            raise LowbitError(f"{opts}: MLX options; use them with --out-format mlx")
        return False
    return True


def _params(args: argparse.Namespace) -> tuple[MLXParams, str | None]:
    return mlx_params(args.to, bits=args.q_bits, group_size=args.q_group_size, mode=args.q_mode)


def run(args: argparse.Namespace) -> int:
    for attr, flag in _NOT_MLX:
        if getattr(args, attr, None):
            raise LowbitError(f"{flag} does not apply to --out-format mlx")
    method = getattr(args, "method", "rtn")
    if method not in METHODS:
        raise LowbitError(
            f"--method {method}: lowbit's MLX output rounds to nearest as mlx_lm.convert does, "
            "or with --method gptq or awq onto the same affine grids"
        )
    if args.budget or args.size:
        return _budget(args, method)
    if getattr(args, "dry_run", False):
        raise LowbitError("--dry-run with --out-format mlx shows a budget's plan (--budget/--size)")
    params, recipe = _params(args)
    source = resolve_model(args.model)
    if args.out is not None and not args.out.strip():
        raise LowbitError("--out is empty; give a folder to write")
    out = Path(args.out) if args.out else Path(f"{_stem(source)}-mlx-{_tag(params, recipe)}")
    progress = False if args.no_progress or args.json else None
    res = quantize_to_mlx(
        source, out, params, recipe=recipe, dtype=args.dtype,
        method=_method(args, method),
        calibration=calibration_of(args) if method != "rtn" else None, threads=args.threads,
        compute=_common.compute_option(args.compute), overwrite=args.overwrite,
        copy_code=args.copy_code, progress=progress, scale_method=args.scale_method,
    )  # fmt: skip
    result, record = res.details, res.method
    if args.json:
        _common.print_json(result)
        return 0
    n = len(result["quantized"])
    print(f"wrote {out} (MLX folder, {result['bytes'] / 1e6:,.1f} MB) in {result['seconds']:.1f} s")
    what = recipe or params.label
    print(f"  {n} weights quantized ({what}); model dtype {result['dtype']}")
    if record is not None:
        err, name = record["mean_error"], record["method"]
        print(
            f"  {name.upper()} onto the MLX grids: {record[name + '_tensors']} tensors, mean "
            f"layer error {err[name]:.4g} (round to nearest {err['rtn']:.4g})"
        )
    print(
        f"  load: mlx_lm.load({str(out)!r})    evaluate: lowbit eval {args.model or 'smollm2'} {out}"
    )
    return 0


def _method(args: argparse.Namespace, method: str) -> str | GPTQ | AWQ:
    if method == "gptq":
        return gptq_config(args)
    if method == "awq":
        return AWQ(clip=not getattr(args, "no_clip", False))
    return "rtn"


def _budget(args: argparse.Namespace, method: str) -> int:
    """``--budget BPW`` / ``--size BYTES``: each module's grid from measured damage."""
    if args.budget and args.size:
        raise LowbitError("give --budget or --size, not both")
    if args.to or args.q_bits or args.q_group_size or (args.q_mode or "affine") != "affine":
        raise LowbitError(
            "--budget/--size with --out-format mlx choose each module's bits and groups (from "
            "--candidates, e.g. 3bit-g64,4bit-g64,6bit-g64); drop --to/--q-bits/--q-group-size/"
            "--q-mode"
        )
    measure = getattr(args, "measure", None) or "exact"
    if measure not in ("exact", "block"):
        raise LowbitError(
            "an MLX budget measures each trial by the model (--measure exact, the default) or "
            "by its block (--measure block); no proxy"
        )
    size = parse_size(args.size) if args.size else None
    bpw = None
    if args.budget:
        try:
            bpw = float(args.budget)
        except ValueError:
            raise LowbitError(
                f"--budget {args.budget!r}: with --out-format mlx, stored bits per quantized "
                "weight (e.g. 4.5), or give --size BYTES"
            ) from None
    source = resolve_model(args.model)
    if args.out is not None and not args.out.strip():
        raise LowbitError("--out is empty; give a folder to write")
    tag = f"budget-{args.budget}" if args.budget else f"size-{args.size}"
    out = Path(args.out) if args.out else Path(f"{_stem(source)}-mlx-{tag}")
    samples, length = scan_windows(args)
    progress = False if args.no_progress or args.json else None
    res = mlx_budget(
        source, out, size=size, bits_per_weight=bpw,
        candidates=_common.parse_list(getattr(args, "candidates", None)) or None,
        dtype=args.dtype, method=_method(args, method),
        calibration=calibration_of(args) if method != "rtn" else None,
        scan_text=args.calib, scan_samples_count=samples, scan_length=length,
        overwrite=args.overwrite, threads=args.threads,
        compute=_common.compute_option(args.compute), progress=progress, dry_run=args.dry_run,
        measure=measure, copy_code=args.copy_code, scale_method=args.scale_method,
    )  # fmt: skip
    doc = res.details
    if args.json:
        _common.print_json(doc)
        return 0
    plan = doc["plan"]
    rows = [[m, t] for m, t in plan["modules"].items()]
    _common.print_table(rows, ["module", "grid"], align="ll")
    counts = ", ".join(f"{n} {t}" for t, n in plan["counts"].items())
    print(
        f"\n{len(rows)} modules from {', '.join(doc['candidates'])}: {counts}; "
        f"{plan['bits_per_weight']:.4f} bits per quantized weight, tensors "
        f"{plan['tensor_bytes']:,} bytes; predicted damage {plan['predicted_damage']:.4e} "
        f"(no choice within the budget below {plan['damage_bound']:.4e}); {doc['trials']} trials"
    )
    print("Dry run: nothing written." if args.dry_run else f"wrote {out}")
    return 0


def _stem(source: Path) -> str:
    stem = source.name
    for suffix in (".gguf", ".safetensors"):
        stem = stem.removesuffix(suffix)
    return stem


def _tag(params: MLXParams, recipe: str | None) -> str:
    if recipe:
        return recipe
    if params.mode == "affine":
        return f"{params.bits}bit-g{params.group_size}"
    return params.mode
