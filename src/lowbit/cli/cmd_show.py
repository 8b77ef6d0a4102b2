"""``lowbit show VALUE``: one value in many formats, bit by bit."""

from __future__ import annotations

import argparse
import math
import re
import textwrap
from typing import Any

from lowbit.cli import _common
from lowbit.cli._payloads import show_payload
from lowbit.formats import explain
from lowbit.formats.explain import exact_decimal

_EPILOG = """\
VALUE is read as the nearest float64 (its exact decimal expansion is printed first),
then rounded once, directly, to each format. It may be a decimal (0.3952, 1e-3),
a hex float (0x1.8p-3), a fraction (1/3), inf, -inf, nan or -0.

what happened:
  exact       the value is representable ("subnormal" when it is one)
  rounded     between two representable values; rounded up or down
  underflow   a non-zero value became zero
  overflow    beyond max: became inf, or NaN in formats without inf (e4m3fn, fnuz)
  saturated   clamped to max: with --saturate (the OCP SAT mode), in formats with
              neither inf nor NaN (fp4, fp6), and in integer and table formats
  nan, inf    NaN or inf in, the same out
  invalid     a negative value into an unsigned format became NaN (e8m0)
  no NaN code a NaN into a format that has none (fp4, int8, nf4): no code

examples:
  lowbit show 0.3952                        the default list of formats
  lowbit show 1000 --formats e4m3,e5m2      overflow in FP8 E4M3, fine in E5M2
  lowbit show 1000 --formats e4m3 --saturate
  lowbit show 0x1.8p-3 --rounding toward_zero
  lowbit show -inf --formats all            every catalog format
  lowbit show 0.3952 --json
"""

_STATUS_COLOUR = {
    "exact": "32",
    "saturated": "33",
    "underflow": "31",
    "overflow": "31",
    "invalid": "31",
    "unrepresentable": "31",
}
_FIELD_COLOUR = {"sign": "36", "exponent": "32", "mantissa": "33"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show",
        help="one value in many formats: nearest value, bits, error, what happened",
        description="Show what becomes of one number in each format: the nearest\n"
        "representable value, its bits split as sign | exponent | mantissa, the code in\n"
        "hex, the absolute and relative error, and what happened.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # let "-inf", "-0x1p-3" and "-1e-3" through as VALUE rather than as options
    p._negative_number_matcher = re.compile(r"^-(\d|\.\d|inf|nan|0x)", re.IGNORECASE)
    p.add_argument("value", metavar="VALUE", help="the number to convert")
    p.add_argument(
        "--formats",
        metavar="A,B,...",
        help="comma-separated format names or aliases, or 'all' "
        "(default: fp32, tf32, bf16, fp16, e4m3, e5m2, e4m3fnuz, e3m2, e2m3, fp4, e8m0, "
        "int8, int4, nf4)",
    )
    p.add_argument(
        "--rounding",
        default="nearest_even",
        metavar="MODE",
        help="nearest_even (default), nearest_away, toward_zero, toward_positive, "
        "toward_negative or stochastic",
    )
    p.add_argument(
        "--saturate",
        action="store_true",
        help="clamp overflow to ±max instead of inf/NaN (OCP SAT mode)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for --rounding stochastic (default 0)")
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    names = _common.parse_names(args.formats, "--formats")
    payload = show_payload(
        args.value, names, rounding=args.rounding, saturate=args.saturate, seed=args.seed
    )
    x, results = payload["float64"], payload["results"]
    if args.json:
        _common.print_json(payload)
        return 0
    colour = _common.use_colour()
    print(_input_line(args.value, x, explain))
    print(
        f"rounding: {payload['rounding']}; overflow: "
        + ("saturate to ±max" if args.saturate else "as each format specifies")
    )
    print()
    rows = [_row(r, colour) for r in results]
    _common.print_table(
        rows,
        ["format", "value", "sign exponent mantissa", "code", "abs err", "rel err", "what"],
        align="lrlrrrl",
    )
    ints = [r["format"] for r in results if r["kind"] == "int"]
    tables = [r["format"] for r in results if r["kind"] == "valueset"]
    if ints or tables:
        parts = []
        if ints:
            parts.append(f"in {', '.join(ints)} the value is rounded to an integer")
        if tables:
            parts.append(f"in {', '.join(tables)} to the nearest raw table entry")
        print()
        print(
            textwrap.fill(
                f"* No scale applied: {'; '.join(parts)}. In practice these formats carry "
                "a scale per tensor, channel or block.",
                width=100,
                subsequent_indent="  ",
            )
        )
    return 0


def _input_line(text: str, x: float, explain: Any) -> str:
    exact = explain.exact_decimal(x)
    if len(exact) > 72:
        exact = f"{exact[:60]}… ({len(exact)} characters; --json has them all)"
    note = ""
    if math.isinf(x) and "inf" not in text.lower():
        note = "  (beyond float64's range)"
    elif x == 0 and any(c in text for c in "123456789"):
        note = "  (below float64's smallest subnormal)"
    hex_text = "" if not math.isfinite(x) else f" = {x.hex()}"
    return f"{text} read as float64: {exact}{hex_text}{note}"


def _row(r: dict[str, Any], colour: bool) -> list[str]:
    name = r["format"] + ("*" if r["kind"] != "float" else "")
    status_colour = _STATUS_COLOUR.get(r["status"])
    what = _common.colour(r["what"], status_colour, colour) if status_colour else r["what"]
    if r["code"] is None:
        return [name, "-", "-", "-", "-", "-", what]
    bits = " ".join(
        _common.colour(v, _FIELD_COLOUR[k], colour) if k in _FIELD_COLOUR else v
        for k, v in r["fields"].items()
        if v
    )
    return [
        name,
        _value(r["value"]),
        bits,
        r["hex"],
        _err(r["abs_error"]),
        _err(r["rel_error"]),
        what,
    ]


def _value(v: float) -> str:
    """Exact when short, else 10 significant digits marked ≈ (--json has it exactly)."""
    exact = exact_decimal(v)
    digits = len(exact.lstrip("-").replace(".", "").lstrip("0"))
    if digits <= 12 and "E" not in exact:
        return exact
    if v == int(v) and abs(v) < 1e12:
        return exact
    return f"≈{v:.10g}"


def _err(v: float | None) -> str:
    if v is None:
        return "-"
    return "0" if v == 0 else f"{v:.3g}"
