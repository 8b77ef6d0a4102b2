"""``lowbit quantize``'s AWQ and SmoothQuant runs (``--method awq``, ``--smooth``), the line
each calibrated method prints, and ``--smooth``'s value (quantize and eval)."""

from __future__ import annotations

import argparse
from typing import Any

from lowbit.calibration.data import Calibration
from lowbit.methods.smoothquant import parse_alpha

__all__ = [
    "add_calibration_options",
    "calibration_of",
    "method_summary",
    "parse_alpha",
]


def add_calibration_options(
    p: argparse.ArgumentParser, *, needs: str, smooth_note: str = ""
) -> None:
    """The options every calibrated method shares, the same in ``quantize`` and ``eval``:
    ``--smooth``, ``--no-clip``, ``--calib``, ``--calib-samples``, ``--calib-len``,
    ``--act-order``, ``--sequential``. ``needs`` names the option ``--smooth`` goes with."""
    p.add_argument(
        "--smooth",
        nargs="?",
        const="search",
        metavar="ALPHA",
        help=f"with {needs}: SmoothQuant's folds before rounding (ALPHA in [0, 1]; "
        f"default: chosen per layer group on the calibration data){smooth_note}",
    )
    p.add_argument("--no-clip", action="store_true", help="awq: no clipping search")
    p.add_argument(
        "--calib",
        metavar="SRC",
        default="default",
        help="gptq/awq/--smooth calibration data: default (the default text from token "
        "32,768, disjoint from what lowbit eval scores), FILE.txt or FILE.jsonl",
    )
    p.add_argument(
        "--calib-samples", type=int, help="calibration windows (default 128) or texts (256)"
    )
    p.add_argument("--calib-len", type=int, help="calibration tokens per window (default 512)")
    p.add_argument(
        "--act-order", choices=("static", "none"), default="static", help="gptq column order"
    )
    p.add_argument(
        "--sequential",
        choices=("layers", "blocks"),
        default="layers",
        help="gptq: layers (default: inside a block each layer group sees the groups before "
        "it quantized; one pass per llama block) or blocks (the whole block on float weights, then "
        "run again; two passes)",
    )
    p.add_argument(
        "--moe-calibrate",
        choices=("all", "routed"),
        default="all",
        help="mixtures of experts, gptq/awq: all (default: every calibration token through "
        "every expert while collecting statistics; outputs stay routed) or routed (each expert "
        "sees the tokens its router picks)",
    )
    p.add_argument(
        "--moe-min-tokens",
        type=int,
        default=32,
        metavar="N",
        help="with --moe-calibrate routed: an expert layer that saw fewer tokens is rounded to "
        "nearest instead (default 32; the run's report names them)",
    )


def calibration_of(args: argparse.Namespace) -> Calibration:
    """The :class:`~lowbit.calibration.data.Calibration` the shared options describe."""
    return Calibration(
        source=args.calib,
        samples=args.calib_samples,
        length=args.calib_len,
        experts=args.moe_calibrate,
        expert_min_tokens=args.moe_min_tokens,
    )


def method_summary(method: dict[str, Any]) -> str:
    """One line on how the calibrated tensors were made."""
    sec, data = method["seconds"], method["calibration"]["described"]
    if sec.get("workers"):  # split over worker processes or Ray actors (--workers, --ray)
        data += f" split over {sec['workers']:.0f} workers"
    if method["method"] == "gptq":
        sq = method.get("smoothquant")
        folds = [] if sq is None else [f for f in sq["folds"] if "skipped" not in f]
        first = "" if sq is None else f"SmoothQuant ({len(folds)} folds), then "
        return (
            f"{first}GPTQ ({method['act_order']} act-order, damp {method['damp']:g}, "
            f"{method.get('sequential', 'blocks')}-sequential) of "
            f"{method['gptq_tensors']} tensors on {data}: {sec['total']:.0f} s (collect "
            f"{sec['collect']:.0f} s, solve {sec['solve']:.0f} s)"
        ) + expert_summary(method)
    how = "AWQ" if method["method"] == "awq" else "SmoothQuant"
    folds = [f for f in method["folds"] if "skipped" not in f]
    layers = method["layers"].values()
    before = sum(e["rtn"] for e in layers) / max(1, len(layers))
    after = sum(e[method["method"]] for e in layers) / max(1, len(layers))
    return (
        f"{how} of {method['method_tensors']} tensors ({len(folds)} folds) on {data}: "
        f"{sec['total']:.0f} s (collect {sec['collect']:.0f} s, search {sec['search']:.0f} s); "
        f"mean layer-output error {after:.4g} vs {before:.4g} rounding to nearest"
    )


def expert_summary(method: dict[str, Any]) -> str:
    """``; experts: ...`` on a mixture of experts' calibration (tokens per expert layer,
    Hessian ranks, fallbacks), else empty."""
    rows = [e for e in method.get("layers", {}).values() if "expert" in e or "fallback" in e]
    if not rows:
        return ""
    tokens = sorted(int(e["tokens"]) for e in rows)
    ranks = [e["rank"] for e in rows if e.get("rank") is not None]
    fell = sum("fallback" in e for e in rows)
    mode = method.get("calibration", {}).get("experts", "all")
    rank = f", Hessian rank {min(ranks)}-{max(ranks)}" if ranks else ""
    return (
        f"; {len(rows)} expert layers ({mode} tokens): {tokens[0]}-{tokens[-1]} tokens each"
        f"{rank}, {fell} rounded to nearest (under "
        f"{method.get('calibration', {}).get('expert_min_tokens', 0)} tokens)"
    )
