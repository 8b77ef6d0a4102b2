"""``lowbit overflow-demo``: 10,000 x 10,000 and friends in every 16- and 8-bit format."""

from __future__ import annotations

import argparse

from lowbit.cli import _common
from lowbit.training.overflow import overflow_table

_EPILOG = """\
cells:
  a number   the value the format stores (rounded once from the exact result)
  inf / NaN  the result overflowed to infinity / became NaN (what one step of FP16
             training without loss scaling can do to every weight)
  sat ±max   clamped to the largest value (saturating formats, integers, --saturate)
  0 (uf)     underflowed to zero (small gradients in FP16 without loss scaling)
  lost       an update that rounds back to the starting value (BF16 weights)

examples:
  lowbit overflow-demo                      every 16- and 8-bit format
  lowbit overflow-demo --formats fp16,bf16,e4m3,e5m2
  lowbit overflow-demo --saturate           OCP "SAT" conversion instead of inf/NaN
  lowbit overflow-demo --json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "overflow-demo",
        help="what 1e4*1e4, 65504+1, a 1e-8 gradient... become in 16- and 8-bit formats",
        description="The classic mixed-precision failures, format by format: each exact result\n"
        "(10,000 x 10,000 = 1e8, FP16's max + 1, exp(12), a gradient of 1e-8, 1 + 1e-3, ...)\n"
        "rounded once into every 16- and 8-bit format, and whether it survives as a value,\n"
        "becomes inf or NaN, saturates, underflows to zero, or is lost.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--formats", help="comma-separated formats (default: every 16- and 8-bit one)")
    p.add_argument("--saturate", action="store_true", help="saturating conversion (clamp to ±max)")
    _common.add_json(p)
    p.set_defaults(func=run)


def _cell(r: dict, fmax: float, colour: bool) -> str:
    kind = r["outcome"]
    if kind in ("inf", "NaN"):
        text = "-inf" if kind == "inf" and r["value"] < 0 else kind
        return _common.colour(text, "31", colour)
    if kind == "saturated":
        sign = "-" if r["value"] < 0 else ""
        return _common.colour(f"sat {sign}{_common.fmt_num(fmax, 5)}", "33", colour)
    if kind == "underflow":
        return _common.colour(
            "-0 (uf)" if str(r["value"]).startswith("-") else "0 (uf)", "33", colour
        )
    if kind == "lost":
        return _common.colour("lost", "33", colour)
    if kind == "no code":
        return "no code"
    return _common.fmt_num(r["value"], 7)


def run(args: argparse.Namespace) -> int:

    table = overflow_table(_common.parse_names(args.formats, "--formats"), saturate=args.saturate)
    if args.json:
        _common.print_json(table)
        return 0
    colour = _common.use_colour()
    print("Each column is an exact result, rounded once into each format "
          f"({'saturating' if args.saturate else 'default'} conversion):")  # fmt: skip
    for c in table["cases"]:
        print(
            f"  {c['label']:<10} {c['expr']:<14} = {_common.fmt_num(c['exact'], 8):<12} {c['why']}"
        )
    print()
    headers = ["format", *[c["label"] for c in table["cases"]]]
    rows = [
        [f["name"], *[_cell(r, f["max"], colour) for r in f["results"]]] for f in table["formats"]
    ]
    _common.print_table(rows, headers, align="l" + "r" * len(table["cases"]))
    return 0
