"""``lowbit values FORMAT``: every finite value of a small format, with its code."""

from __future__ import annotations

import argparse

from lowbit.cli import _common
from lowbit.cli._payloads import values_payload
from lowbit.formats import explain

_EPILOG = """\
Lists formats of at most 8 bits (256 codes), in ascending order of value, -0 before +0;
the codes of inf and NaN follow the table. For wider formats use `lowbit decode` on
single codes, or `lowbit formats` for their range and precision.

examples:
  lowbit values fp4              the 16 codes of FP4 E2M1 (15 distinct values)
  lowbit values e2m3             the 64 codes of FP6 E2M3
  lowbit values e4m3 --json      every FP8 E4M3 value with code and fields, as JSON
  lowbit values nf4              the QLoRA NormalFloat table
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "values",
        help="every finite value of a format of 8 bits or fewer",
        description="List every finite value of a small format with its code, its\n"
        "sign | exponent | mantissa bits, its class and how the bits give the value.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("format", metavar="FORMAT", help="format name or alias (fp4, e4m3, nf4, ...)")
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    payload = values_payload(args.format)
    if args.json:
        _common.print_json(payload)
        return 0
    finite, special = payload["values"], payload["non_finite"]
    distinct = payload["distinct_values"]
    colour = _common.use_colour()
    zeros = sum(1 for d in finite if d["value"] == 0)
    extra = " (+0 and -0)" if zeros == 2 else ""
    print(
        f"{payload['format']}: {payload['codes']} codes, {len(finite)} finite, {distinct} distinct values{extra}"
    )
    print()
    headers = ["code", "bits", "value", "class", "how"]
    rows = [
        [d["hex"], _bits(d, colour), explain.short_decimal(d["value"]), d["class"], d["formula"]]
        for d in finite
    ]
    _common.print_table(rows, headers, align="llrll")
    if special:
        print()
        for label, cls in (("+inf", "inf"), ("NaN", "NaN")):
            codes = [d for d in special if d["class"] == cls]
            if cls == "inf":
                for d in codes:
                    sign = "-" if d["value"] < 0 else "+"
                    print(f"{sign}inf: {d['hex']}  ({d['bits']})")
            elif codes:
                print(f"{label}: {', '.join(d['hex'] for d in codes)}")
    return 0


def _bits(d: dict, colour: bool) -> str:
    if d["kind"] != "float":
        return d["bits"]
    return " ".join(
        _common.colour(v, c, colour)
        for v, c in (
            (d["fields"]["sign"], "36"),
            (d["fields"]["exponent"], "32"),
            (d["fields"]["mantissa"], "33"),
        )
        if v
    )
