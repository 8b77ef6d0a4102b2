"""``lowbit decode FORMAT CODE``: what a bit pattern means."""

from __future__ import annotations

import argparse

from lowbit.cli import _common
from lowbit.cli._payloads import decode_payload

_EPILOG = """\
CODE is the bit pattern as an unsigned integer: hex (0x7e), binary (0b01111110) or
decimal (126). Underscores are ignored (0b0_1111_110); a bare string of 0s and 1s
that starts with 0 (0110) is read as binary.

examples:
  lowbit decode e4m3 0x7e          448, the largest FP8 E4M3 value
  lowbit decode e4m3 0x7f          NaN (E4M3 has no infinities)
  lowbit decode e5m2 0b01111100    +inf
  lowbit decode e4m3fnuz 0x80      NaN: fnuz formats have no -0
  lowbit decode fp4 0b0101         3
  lowbit decode int8 0xfe          -2, two's complement
  lowbit decode e8m0 127 --json    the MX scale 2^0 = 1, as JSON
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decode",
        help="what a bit pattern means in a format",
        description="Decode one code (bit pattern) of a format: its value, class\n"
        "(normal, subnormal, zero, inf, NaN), its sign | exponent | mantissa fields and\n"
        "the formula that gives the value.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("format", metavar="FORMAT", help="format name or alias (e4m3, bf16, fp4, ...)")
    p.add_argument("code", metavar="CODE", help="the bit pattern: 0x7e, 0b01111110 or 126")
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    d = decode_payload(args.format, args.code)
    if args.json:
        _common.print_json(d)
        return 0
    colour = _common.use_colour()
    if d["kind"] == "float":
        fields = d["fields"]
        bits = " ".join(
            _common.colour(fields[k], c, colour)
            for k, c in (("sign", "36"), ("exponent", "32"), ("mantissa", "33"))
            if fields[k]
        )
        parts = [k for k in ("sign", "exponent", "mantissa") if fields[k]]
        legend = " | ".join(parts)
    else:
        bits = d["bits"]
        legend = "table index" if d["kind"] == "valueset" else "integer bits"
    print(f"{d['format']} code {d['hex']} = {d['binary']} = {d['code']}")
    print(f"  bits     {bits}   ({legend})")
    print(f"  class    {d['class']}")
    print(f"  value    {d['value_exact']}")
    print(f"  formula  {d['formula']}")
    return 0
