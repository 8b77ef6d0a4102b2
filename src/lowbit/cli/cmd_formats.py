"""``lowbit formats``: one table of every catalog format and its derived properties."""

from __future__ import annotations

import argparse
import math
from typing import Any

from lowbit.cli import _common
from lowbit.formats.catalog import ALIASES, FORMATS

_EPILOG = """\
columns:
  bits      width of one code          s/e/m    sign / exponent / mantissa bits
  bias      exponent bias              max      largest finite value
  min nrm   smallest normal value      min pos  smallest positive (subnormal) value
  eps       gap between 1 and the next value
  digits    decimal digits of precision, -log10(eps/2)
  range     dynamic range in binades, log2(max / min pos)
  finite    number of codes with a finite value (both zeros counted)
  special   inf and/or NaN codes the format has
  store     bytes per value unpacked (in memory, one per container) / bits packed
  dtype     matching dtype of the same name: np (numpy), ml (ml_dtypes), pt (torch)

examples:
  lowbit formats                   every format
  lowbit formats --kind float      only the floating-point formats
  lowbit formats --json            every property of every format, with aliases
"""

_HEADERS = [
    "name",
    "bits",
    "s/e/m",
    "bias",
    "max",
    "min nrm",
    "min pos",
    "eps",
    "digits",
    "range",
    "finite",
    "special",
    "store",
    "dtype",
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "formats",
        help="every number format with its range, precision and cost",
        description="Every format in the catalog with the properties derived from its\n"
        "layout: range, precision, special values, storage cost and matching dtypes.\n"
        "Names are canonical (ml_dtypes / torch); the short names people type\n"
        "(fp8, e4m3, bf16, fp4, ...) are aliases, listed by --json.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--kind",
        choices=["float", "int", "valueset"],
        help="only formats of this kind (valueset: NF4, binary, ternary)",
    )
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    formats = [f for f in FORMATS.values() if args.kind in (None, f.kind)]
    if args.json:
        aliases: dict[str, list[str]] = {}
        for alias, name in ALIASES.items():
            if alias != name:
                aliases.setdefault(name, []).append(alias)
        _common.print_json(
            [
                {
                    **f.describe(),
                    "description": getattr(f, "description", ""),
                    "aliases": aliases.get(f.name, []),
                }
                for f in formats
            ]
        )
        return 0
    rows = [_row(f.describe()) for f in formats]
    _common.print_table(rows, _HEADERS, align="lrlrrrrrrrrlll")
    print("\n`lowbit formats --help` explains the columns; --json adds the aliases.")
    return 0


def _row(d: dict[str, Any]) -> list[str]:
    is_float = d["kind"] == "float"
    if is_float:
        sem = f"{d['sign_bits']}/{d['exponent_bits']}/{d['mantissa_bits']}"
    elif d["kind"] == "int":
        sem = "int" if d["min"] < 0 else "uint"
    else:
        sem = "table"
    special = "+".join(n for n, has in (("inf", d["has_inf"]), ("nan", d["has_nan"])) if has)
    dtype = []
    if d["ml_dtypes"]:
        native = d["ml_dtypes"] in ("float16", "float32", "float64") or (
            d["kind"] == "int" and d["bits"] in (8, 16, 32)
        )
        dtype.append("np" if native else "ml")
    if d["torch"]:
        dtype.append("pt")
    return [
        d["name"],
        str(d["bits"]),
        sem,
        "-" if d["bias"] is None else str(d["bias"]),
        _num(d["max"]),
        _num(d["smallest_normal"], pow2=is_float),
        _num(d["smallest_positive"], pow2=is_float),
        _num(d["eps"], pow2=is_float),
        _fixed(d["digits"], 2) if d["kind"] != "int" else "-",
        _fixed(d["dynamic_range_binades"], 1),
        _count(d["finite_count"]),
        special or "-",
        f"{d['container_bytes']}B/{d['packed_bits']}b",
        ",".join(dtype) or "-",
    ]


def _num(v: float | None, pow2: bool = False) -> str:
    """Compact value: 2^k for powers of two (when asked), integers plainly, else 4 digits."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    v = float(v)
    mant, exp = math.frexp(v)
    if v > 0 and (pow2 or v > 2**20) and mant == 0.5 and not 1 <= v <= 64:
        return f"2^{exp - 1}"
    if v == int(v) and abs(v) < 1e7:
        return str(int(v))
    return f"{v:.4g}" if 1e-4 <= abs(v) < 1e7 else f"{v:.3g}"


def _fixed(v: float | None, places: int) -> str:
    if v is None or math.isnan(v) or math.isinf(v):
        return "-"
    return f"{v:.{places}f}"


def _count(n: int) -> str:
    return str(n) if n < 10**6 else f"{n:.3g}"
