"""``--budget`` / ``--size`` / ``--plan-preset`` for ``lowbit quantize`` and ``lowbit plan``:
the options, solving, and the table."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from lowbit.checkpoints.io.outputs import check_output
from lowbit.checkpoints.streaming import checkpoint_tensors
from lowbit.cli import _common
from lowbit.cli._mixed_plots import plot_plan
from lowbit.cli._scan import add_scan_options, check_json_output, scan, write_json
from lowbit.cli.cmd_eval import print_result
from lowbit.errors import LowbitError
from lowbit.evaluation.variants import evaluate_variants
from lowbit.jobs.budget import mixed_plan
from lowbit.plans.mixed import PRESETS, preset_plan
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import METHODS


def add_options(
    p: argparse.ArgumentParser,
    *,
    measure: str | None = "exact",
    presets: bool = True,
    calib: bool = True,
) -> None:
    """The mixed-precision options (a scan's options come with them)."""
    g = p.add_argument_group("mixed precision (one scheme per tensor from measured sensitivity)")
    g.add_argument(
        "--budget",
        metavar="BPW|PRESET",
        help="stored bits per quantized weight, scales included (e.g. 4.5), or a preset's name "
        "(q4_k_m_like): the bits/weight that preset gives this model; with --out-format gguf "
        "(quantize): bits per weight of the tensors llama.cpp quantizes, each given a GGUF type; "
        "with --out-format mlx: of the modules MLX quantizes, each given bits and a group size",
    )
    g.add_argument(
        "--size",
        metavar="BYTES",
        help="total output tensor bytes, e.g. 80MB, 1.2GiB; with --out-format gguf (quantize): "
        "the whole file's bytes, metadata included; with --out-format mlx: the folder's tensor "
        "bytes (its index's total_size)",
    )
    g.add_argument(
        "--sensitivity",
        metavar="FILE.json",
        help="a lowbit sensitivity --out result (default: run the scan here)",
    )
    g.add_argument(
        "--min-format", metavar="SCHEME", help="no tensor gets fewer bits than this scheme gives"
    )
    g.add_argument(
        "--candidates",
        metavar="LIST",
        help="schemes of the scan that may be chosen (default all); with --out-format gguf "
        "(quantize): GGUF types, e.g. q4_k,q6_k,q8_0 (default Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,Q8_0,"
        "IQ4_XS; K-quants fall back as in llama-quantize on rows that are not whole blocks); with "
        "--out-format mlx: affine grids <bits>bit-g<group>, e.g. 3bit-g64,4bit-g64,6bit-g64 "
        "(default 2bit-g64,3bit-g32,3bit-g64,4bit-g32,4bit-g64,4bit-g128,5bit-g64,6bit-g64,"
        "8bit-g64)",
    )
    if presets:
        g.add_argument(
            "--plan-preset",
            metavar="NAME",
            help="a fixed mixed plan instead: q4_k_m_like (llama.cpp Q4_K_M's rule in lowbit "
            "schemes: int6:g128 for the promoted tensors, --to (default int4:g128) elsewhere)",
        )
    add_scan_options(g, required=False, measure=measure, calib=calib)  # type: ignore[arg-type]


def wanted(args: argparse.Namespace) -> bool:
    return bool(args.budget or args.size)


def _user_plan(args: argparse.Namespace) -> str | None:
    """The plan file whose rules decide first (quantize --plan, plan --plan-file)."""
    return getattr(args, "plan", None) or getattr(args, "plan_file", None)


def check(args: argparse.Namespace) -> None:
    """Refuse combinations that say two things."""
    if args.budget and args.size:
        raise LowbitError("give --budget or --size, not both")
    if getattr(args, "plan_preset", None) and (args.budget or args.size):
        raise LowbitError("--plan-preset is a fixed plan; --budget/--size solve for one")
    if hasattr(args, "eval") and not wanted(args) and args.plot:
        raise LowbitError("--plot draws a mixed plan: give --budget or --size")
    if getattr(args, "eval", False) and args.out_format != "lowbit":
        raise LowbitError("--eval measures lowbit checkpoints; use lowbit eval for the others")
    if wanted(args) and getattr(args, "to", None) is not None:
        raise LowbitError(
            "--budget/--size choose the schemes (from --schemes or the scan); drop --to"
        )
    if wanted(args) and not (args.sensitivity or args.schemes):
        raise LowbitError(
            "--budget/--size need candidate schemes: --schemes int3:g128,int4:g128,int8:ch "
            "(a scan runs here) or --sensitivity FILE.json (lowbit sensitivity --out)"
        )


def preset(args: argparse.Namespace, ckpt: Any) -> Any:
    """The ``--plan-preset`` plan (the ``--plan`` file's rules first, when given)."""
    fixed = preset_plan(args.plan_preset, checkpoint_tensors(ckpt), base=args.to)
    if args.plan:
        user = PrecisionPlan.from_file(args.plan)
        fixed = PrecisionPlan(rules=user.rules + fixed.rules, default=fixed.default,
                              activations=user.activations)  # fmt: skip
    return fixed


def solve(args: argparse.Namespace, ckpt: Any, progress: bool | None) -> tuple[Any, Any]:
    """Read or run the scan and solve: ``(MixedPlan, SensitivityResult)``."""
    result = None if args.sensitivity else scan(args, ckpt, progress)
    return mixed_plan(
        ckpt, budget=args.budget or None, size=args.size or None,
        sensitivity_result=result if result is not None else args.sensitivity,
        base=_user_plan(args), candidates=_common.parse_list(args.candidates) or None,
        min_scheme=args.min_format, method=_rule_method(args),
    )  # fmt: skip


def _rule_method(args: argparse.Namespace) -> str | None:
    """The ``--method`` the written plan's rules record (``gptq``, ``awq``): a calibrated
    method, so that ``lowbit quantize --plan OUT.plan.json`` needs no ``--method`` to reproduce
    the output. None for ``rtn`` (the plan names no method, as before)."""
    method = getattr(args, "method", "rtn")
    return method if method in METHODS and method != "rtn" else None


def replay(args: argparse.Namespace, plan_file: Path) -> list[str]:
    """The ``lowbit quantize`` arguments that reproduce the output from its plan file: the
    plan, and what the plan cannot record (``--smooth``, calibration and method settings given
    on the command line, the output format)."""
    argv = ["--plan", str(plan_file)]
    smooth = getattr(args, "smooth", None)
    if smooth is not None:
        argv += ["--smooth", smooth]
    for flag, value, default in (  # only the options given (rule methods calibrate too)
        ("--calib", args.calib, "default"),
        ("--calib-samples", args.calib_samples, None),
        ("--calib-len", args.calib_len, None),
        ("--scan-samples", getattr(args, "scan_samples", None), None),
        ("--scan-len", getattr(args, "scan_len", None), None),
        ("--act-order", args.act_order, "static"),
        ("--sequential", args.sequential, "layers"),
        ("--damp", args.damp, 0.01),
    ):
        if value != default:
            argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if args.no_clip:
        argv.append("--no-clip")
    if args.out_format != "lowbit":
        argv += ["--out-format", args.out_format]
    return argv


def plan_path(out: Path, out_format: str) -> Path:
    """Where the plan file goes: beside the checkpoint, ``OUT.plan.json`` (a lowbit folder
    records every file it holds, so the plan stays outside it)."""
    return out.with_name(out.name + ".plan.json")


def precheck(args: argparse.Namespace, ckpt: Any, out: Path) -> None:
    """Before a scan that may take minutes: the outputs ``lowbit quantize --budget`` will write
    (the checkpoint, OUT.plan.json, the plot) can be written."""
    kind = "file" if args.out_format == "gguf" else "dir"
    check_output(out, overwrite=args.overwrite, kind=kind, inputs=[ckpt.path])
    check_json_output(plan_path(out, args.out_format), args.overwrite, "plan")
    if args.plot:
        check_output(Path(args.plot), overwrite=args.overwrite)


def compare_preset(mixed: Any, result: Any, ckpt: Any) -> dict[str, Any] | None:
    """The q4_k_m_like preset's bits/weight and predicted damage from the same scan (None when
    the scan lacks its schemes)."""
    tensors = checkpoint_tensors(ckpt)
    name = next(iter(PRESETS))
    applied = preset_plan(name, tensors).apply(tensors)
    table = result.table()
    damage = 0.0
    for t in applied.quantized:
        e = table.get(t.name, {}).get(t.label)
        if e is None:
            return None
        damage += result.score(e)
    return {"preset": name, "bits_per_weight": applied.totals()["bits_per_weight"],
            "predicted_damage": damage}  # fmt: skip


def print_mixed(mixed: Any, result: Any, versus: dict[str, Any] | None) -> None:
    """The plan as a layer x kind table of schemes, the totals per scheme, the solver's gap."""
    rows = list(mixed.rows)
    kinds = list(dict.fromkeys(r.kind for r in rows))
    layers = sorted(dict.fromkeys(r.layer for r in rows), key=lambda x: (x is None, x or 0))
    cell = {(r.layer, r.kind): r for r in rows}
    table = []
    for layer in layers:
        line: list[Any] = ["-" if layer is None else str(layer)]
        for k in kinds:
            r = cell.get((layer, k))
            line.append("" if r is None else _short(r.scheme) + ("*" if r.pinned else ""))
        dmg = sum(r.damage or 0.0 for r in rows if r.layer == layer)
        line.append(f"{dmg:.3e}")
        table.append(line)
    _common.print_table(table, ["layer", *kinds, "damage"], align="r" + "l" * len(kinds) + "r")
    print()
    per = [[_short(d["scheme"]), d["tensors"], d["weights"], f"{d['bits_per_weight']:.3f}",
            f"{d['damage']:.3e}"] for d in mixed.by_scheme()]  # fmt: skip
    _common.print_table(per, ["scheme", "tensors", "weights", "bits/w", "predicted damage"],
                        align="lrrrr")  # fmt: skip
    a = mixed.allocation
    b = mixed.budget
    want = (f"{b['value']:g} bits/weight" if b["kind"] == "bits_per_weight"
            else f"{b['value'] / 1e6:,.2f} MB of tensors")  # fmt: skip
    print(
        f"\nbudget {want}: chose {mixed.bits_per_weight:.4f} bits/weight over "
        f"{mixed.quantized_weights:,} quantized weights, {mixed.total_bytes / 1e6:,.2f} MB of "
        f"tensors in all"
    )
    print(
        f"predicted damage (sum over tensors of the scan's {mixed.metric}): "
        f"{mixed.predicted_damage:.4e}; optimality: at most {a.gap:.3e} above the best plan "
        f"within the budget (Lagrangian bound {a.bound:.4e}; budget unit {a.unit} bits)"
    )
    if any(r.pinned for r in rows):
        print("* pinned by a --plan rule")
    if versus is not None:
        print(
            f"for comparison, {versus['preset']} (fixed rule) on the same scan: "
            f"{versus['bits_per_weight']:.4f} bits/weight, predicted damage "
            f"{versus['predicted_damage']:.4e}"
        )


def _short(label: str) -> str:
    return label.removesuffix(":fp32")


def after_write(
    args: argparse.Namespace,
    ckpt: Any,
    mixed: Any,
    scan: Any,
    out: Path,
    progress: bool | None,
) -> dict[str, Any]:
    """After ``lowbit quantize`` wrote ``out``: the plan file, the plot, ``--eval``.

    Returns what to add to the ``--json`` output (``mixed``, ``plan_file``, ``eval``).
    """
    extra: dict[str, Any] = {}
    if mixed is not None:
        path = plan_path(out, args.out_format)
        write_json(path, mixed.plan.to_dict(), args.overwrite, "plan")
        extra["plan_file"] = str(path)
        extra["replay"] = ["lowbit", "quantize", str(args.model or "smollm2"),
                           *replay(args, path)]  # fmt: skip
        extra["mixed"] = mixed.to_dict()
        versus = compare_preset(mixed, scan, ckpt)
        if versus is not None:
            extra["mixed"]["preset_on_same_scan"] = versus
    if args.plot and mixed is not None:
        plot_plan(mixed, Path(args.plot), f"{ckpt.path.name}: mixed plan for {_want(mixed)}",
                  args.overwrite)  # fmt: skip
        extra["plot"] = args.plot
    if args.eval:
        ev = evaluate_variants(
            args.model,
            [out],
            [],
            progress=progress,
            threads=getattr(args, "threads", None),
            compute=getattr(args, "compute", "fp32"),
        )
        extra["eval"] = ev
        if mixed is not None:
            extra["predicted_vs_measured"] = predicted_vs_measured(mixed, ev)
    return extra


def predicted_vs_measured(mixed: Any, ev: dict[str, Any]) -> dict[str, Any]:
    """The scan's prediction (sum of per-tensor damages) beside the measured damage of the
    whole quantized model, in the same units when the scan was exact."""
    row = ev["rows"][-1]
    if ev["kind"] == "causal-lm":
        measured = row["kl_mean"]
        what = "mean KL(original || quantized), nats"
    else:
        measured = 1.0 - row["mean_cosine"]
        what = "1 - mean cosine"
    return {
        "predicted": mixed.predicted_damage if mixed.measure in ("exact", "block") else None,
        "measured": measured,
        "metric": what,
        "perplexity_change": row.get("change"),
        "nn_agreement": row.get("nn_agreement"),
    }


def _want(mixed: Any) -> str:
    b = mixed.budget
    if b["kind"] == "bits_per_weight":
        return f"{b['value']:g} bits/weight"
    return f"{b['value'] / 1e6:,.2f} MB"


def print_after(
    args: argparse.Namespace, ckpt: Any, mixed: Any, scan: Any, extra: dict[str, Any]
) -> None:
    """The text ``lowbit quantize`` adds after its summary for a mixed plan or ``--eval``."""
    if mixed is not None:
        print()
        print_mixed(mixed, scan, extra["mixed"].get("preset_on_same_scan"))
        print(f"plan file: {extra['plan_file']} (reproduce: {shlex.join(extra['replay'])} "
              "--out ...)")  # fmt: skip
    if "plot" in extra:
        print(f"plot written to {extra['plot']}")
    if "eval" in extra:
        print()
        print_result(extra["eval"])
        pm = extra.get("predicted_vs_measured")
        if pm is not None:
            pred = "-" if pm["predicted"] is None else f"{pm['predicted']:.4e}"
            print(
                f"predicted vs measured damage ({pm['metric']}): predicted {pred} (sum of "
                f"per-tensor damages on calibration data), measured {pm['measured']:.4e} on "
                f"eval's data"
            )


def print_dry_run(args: argparse.Namespace, ckpt: Any, mixed: Any, scan: Any) -> int:
    """``lowbit quantize --budget ... --dry-run`` and ``lowbit plan --budget``: the choice and
    the memory it gives, nothing written."""
    versus = compare_preset(mixed, scan, ckpt)
    if args.plot:
        plot_plan(mixed, Path(args.plot), f"{ckpt.path.name}: mixed plan for {_want(mixed)}",
                  getattr(args, "overwrite", False))  # fmt: skip
    if args.json:
        doc = mixed.to_dict()
        if versus is not None:
            doc["preset_on_same_scan"] = versus
        _common.print_json(doc)
        return 0
    print_mixed(mixed, scan, versus)
    print("Dry run: nothing written (lowbit quantize --budget ... --out DIR writes it).")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0
