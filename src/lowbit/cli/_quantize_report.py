"""What ``lowbit quantize`` prints: the plan table, the summary line, the files written and the warnings."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lowbit.checkpoints.readers import Checkpoint
from lowbit.cli import _common
from lowbit.plans.plan import AppliedPlan


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f} MB"


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
