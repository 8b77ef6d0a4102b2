"""The catalog: one declaration per format, aliases in one dict, lookup by name.

Canonical names follow ml_dtypes / torch / LLVM (see ``lowbit.formats.floats`` for the
``f``, ``n``, ``uz`` suffixes); the short names people type are aliases. Lookup is
case-insensitive and an unknown name lists the close matches.
"""

from __future__ import annotations

import difflib
import re
from functools import cache

from lowbit.enums import Inf, NaN
from lowbit.errors import LowbitError, UnknownFormatError
from lowbit.formats.base import Format
from lowbit.formats.floats import FloatFormat
from lowbit.formats.ints import IntFormat
from lowbit.formats.mx import MXFormat
from lowbit.formats.valueset import ValueSetFormat

__all__ = [
    "ALIASES",
    "FORMATS",
    "MX_ALIASES",
    "MX_FORMATS",
    "NF4_TABLE",
    "format",
    "mx_format",
    "p3109",
]

I, N = Inf, NaN

# QLoRA NormalFloat4 (Dettmers et al. 2023, arXiv 2305.14314, Appendix E), as the float32
# values bitsandbytes ships (functional.py, get_4bit_type "nf4"). Built from normal
# quantiles with offset 0.9677083; tests re-derive them from the quantile function.
NF4_TABLE = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


def p3109(k: int, p: int, signed: bool = True, extended: bool = True) -> FloatFormat:
    """IEEE P3109 format ``binary{k}p{p}`` (signed/unsigned, extended/finite domain).

    As in the P3109 interim report and gfloat's ``format_info_p3109``: precision ``p``
    counts the implicit bit; bias ``2**(k-p-1)`` (signed) or ``2**(k-p)`` (unsigned);
    no negative zero (its code, 0x80 for k=8, is the NaN) for signed formats, the top
    code is the NaN for unsigned ones; extended formats put ±inf on the largest codes.
    """
    if not 2 <= k <= 16 or not 1 <= p <= k - (1 if signed else 0):
        raise UnknownFormatError(
            f"P3109 format needs 2 <= k <= 16 and 1 <= p < k (got k={k}, p={p})"
        )
    ebits = k - p + (0 if signed else 1)
    return FloatFormat(
        name=f"p3109_k{k}p{p}{'s' if signed else 'u'}{'e' if extended else 'f'}",
        ebits=ebits,
        mbits=p - 1,
        bias=(1 << (k - p - 1)) if signed and k - p >= 1 else (0 if signed else 1 << (k - p)),
        signed=signed,
        inf=I.HIGH if extended else I.NONE,
        nan=N.NEG_ZERO if signed else N.HIGH,
        description=f"IEEE P3109 K={k} P={p} {'signed' if signed else 'unsigned'} "
        f"{'extended' if extended else 'finite'}",
    )


_F = FloatFormat
_DECLARED: list[Format] = [
    _F(name="float64", ebits=11, mbits=52, description="IEEE 754 binary64"),
    _F(name="float32", ebits=8, mbits=23, description="IEEE 754 binary32"),
    _F(name="tensorfloat32", ebits=8, mbits=10, container=32,
       description="NVIDIA TF32: FP32 range, FP16 precision, stored in 32 bits"),
    _F(name="bfloat16", ebits=8, mbits=7, description="Google brain float: FP32 range, 8-bit precision"),
    _F(name="float16", ebits=5, mbits=10, description="IEEE 754 binary16"),
    _F(name="float8_e4m3fn", ebits=4, mbits=3, inf=I.NONE, nan=N.HIGH,
       description="OCP FP8 E4M3: no inf, NaN = S.1111.111"),
    _F(name="float8_e5m2", ebits=5, mbits=2, description="OCP FP8 E5M2: IEEE-like"),
    _F(name="float8_e4m3fnuz", ebits=4, mbits=3, bias=8, inf=I.NONE, nan=N.NEG_ZERO,
       description="FP8 E4M3, bias 8, one NaN at 0x80, no -0 (AMD/Graphcore)"),
    _F(name="float8_e5m2fnuz", ebits=5, mbits=2, bias=16, inf=I.NONE, nan=N.NEG_ZERO,
       description="FP8 E5M2, bias 16, one NaN at 0x80, no -0 (AMD/Graphcore)"),
    _F(name="float8_e4m3", ebits=4, mbits=3, description="IEEE-style E4M3 with inf (max 240)"),
    _F(name="float8_e3m4", ebits=3, mbits=4, description="IEEE-style E3M4"),
    _F(name="float8_e4m3b11fnuz", ebits=4, mbits=3, bias=11, inf=I.NONE, nan=N.NEG_ZERO,
       description="E4M3, bias 11, NaN at 0x80 (Graphcore)"),
    _F(name="float6_e3m2fn", ebits=3, mbits=2, inf=I.NONE, nan=N.NONE,
       description="OCP MX FP6 E3M2: no inf, no NaN"),
    _F(name="float6_e2m3fn", ebits=2, mbits=3, inf=I.NONE, nan=N.NONE,
       description="OCP MX FP6 E2M3: no inf, no NaN"),
    _F(name="float4_e2m1fn", ebits=2, mbits=1, inf=I.NONE, nan=N.NONE,
       description="OCP MX FP4 E2M1: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}"),
    _F(name="float8_e8m0fnu", ebits=8, mbits=0, signed=False, inf=I.NONE, nan=N.HIGH,
       subnormals=False, description="OCP MX scale: powers of two 2^-127..2^127, NaN = 0xFF"),
    *[p3109(8, p) for p in range(1, 8)],
    p3109(8, 3, extended=False),
    p3109(8, 4, extended=False),
    p3109(8, 3, signed=False),
    p3109(8, 4, signed=False),
    p3109(6, 3, extended=False),
    p3109(4, 2, extended=False),
    *[IntFormat(name=f"int{n}", nbits=n, description=f"{n}-bit two's complement") for n in range(2, 9)],
    IntFormat(name="int16", nbits=16, description="16-bit two's complement"),
    IntFormat(name="int32", nbits=32, description="32-bit two's complement"),
    *[IntFormat(name=f"uint{n}", nbits=n, signed=False, description=f"{n}-bit unsigned")
      for n in range(2, 9)],
    ValueSetFormat(name="nf4", table=NF4_TABLE, description="QLoRA 4-bit NormalFloat",
                   source="arXiv 2305.14314; bitsandbytes get_4bit_type('nf4')"),
    ValueSetFormat(name="binary", table=(-1.0, 1.0), description="BNN sign: {-1, +1}"),
    ValueSetFormat(name="ternary", table=(-1.0, 0.0, 1.0), description="TWN: {-1, 0, +1}"),
]  # fmt: skip

#: Every catalog format by canonical name.
FORMATS: dict[str, Format] = {f.name: f for f in _DECLARED}

ALIASES: dict[str, str] = {
    "fp64": "float64", "double": "float64", "f64": "float64",
    "fp32": "float32", "single": "float32", "float": "float32", "f32": "float32",
    "tf32": "tensorfloat32",
    "bf16": "bfloat16",
    "fp16": "float16", "half": "float16", "f16": "float16",
    "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn",
    "e4m3fn": "float8_e4m3fn", "fp8_e4m3fn": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2",
    "fp8_e4m3fnuz": "float8_e4m3fnuz", "e4m3fnuz": "float8_e4m3fnuz",
    "fp8_e5m2fnuz": "float8_e5m2fnuz", "e5m2fnuz": "float8_e5m2fnuz",
    "fp8_e3m4": "float8_e3m4", "e3m4": "float8_e3m4",
    "fp6_e3m2": "float6_e3m2fn", "e3m2": "float6_e3m2fn", "fp6": "float6_e3m2fn",
    "fp6_e2m3": "float6_e2m3fn", "e2m3": "float6_e2m3fn",
    "fp4": "float4_e2m1fn", "fp4_e2m1": "float4_e2m1fn", "e2m1": "float4_e2m1fn",
    "e8m0": "float8_e8m0fnu", "fp8_e8m0": "float8_e8m0fnu", "e8m0fnu": "float8_e8m0fnu",
    "nf4": "nf4", "normalfloat4": "nf4",
    "int": "int32", "sign": "binary", "bnn": "binary", "twn": "ternary",
}  # fmt: skip


def _mx(name: str, element: str, description: str, int_shift: int = 0) -> MXFormat:
    return MXFormat(
        name=name,
        element=FORMATS[element],
        scale=FORMATS["float8_e8m0fnu"],
        int_shift=int_shift,
        description=description,
    )


#: The OCP MX block formats (MX v1.0 §5) by canonical name. Their element emax is derived
#: from the element format (``MXFormat.emax_elem``).
MX_FORMATS: dict[str, MXFormat] = {
    f.name: f
    for f in (
        _mx("mxfp8_e4m3", "float8_e4m3fn", "OCP MXFP8 (E4M3 elements)"),
        _mx("mxfp8_e5m2", "float8_e5m2", "OCP MXFP8 (E5M2 elements)"),
        _mx("mxfp6_e3m2", "float6_e3m2fn", "OCP MXFP6 (E3M2 elements)"),
        _mx("mxfp6_e2m3", "float6_e2m3fn", "OCP MXFP6 (E2M3 elements)"),
        _mx("mxfp4", "float4_e2m1fn", "OCP MXFP4 (E2M1 elements)"),
        _mx("mxint8", "int8", "OCP MXINT8 (int8 * 2^-6)", int_shift=6),
    )
}

MX_ALIASES: dict[str, str] = {
    "mxfp8": "mxfp8_e4m3",
    "mxfp6": "mxfp6_e3m2",
    "mxfp4_e2m1": "mxfp4",
    "mxfp8_e4m3fn": "mxfp8_e4m3",
}


@cache
def mx_format(name: str) -> MXFormat:
    """Look up an MX block format by name (``mxfp4``, ``mxfp8_e4m3``, ``mxint8``, ...).

    Raises:
        LowbitError: unknown MX name (the message lists the known ones).
    """
    key = name.strip().lower().replace("-", "_")
    key = MX_ALIASES.get(key, key)
    if key not in MX_FORMATS:
        raise LowbitError(f"unknown MX format {name!r}; known: {', '.join(MX_FORMATS)}")
    return MX_FORMATS[key]


_P3109 = re.compile(r"p3109_k(\d{1,4})p(\d{1,4})([su]?)([ef]?)$")  # int() takes 4 digits


def format(name: str | Format) -> Format:
    """Look up a format by canonical name or alias (case-insensitive).

    Any ``p3109_k{K}p{P}[s|u][e|f]`` name builds that P3109 format (default signed,
    extended).

    Raises:
        UnknownFormatError: the name is unknown; the message lists the close matches.
    """
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise UnknownFormatError(f"a format name must be a string, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key in FORMATS:
        return FORMATS[key]
    m = _P3109.match(key)
    if m:
        k, p = int(m.group(1)), int(m.group(2))
        return p3109(k, p, signed=m.group(3) != "u", extended=m.group(4) != "f")
    if key.startswith("mx"):
        if key in MX_FORMATS or key.replace("_", "") in MX_FORMATS:
            raise UnknownFormatError(
                f"{name!r} is an OCP MX block format (32 elements share a power-of-two scale), "
                f"not an element format: use lowbit.quantize(x, {name!r}) or "
                f"lowbit.formats.catalog.mx_format({name!r})"
            )
    choices = list(FORMATS) + list(ALIASES)
    close = difflib.get_close_matches(key, choices, n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    shown = repr(name) if len(name) <= 80 else repr(name[:60]) + f" (... {len(name):,} characters)"
    raise UnknownFormatError(f"unknown format {shown}{hint} (`lowbit formats` lists them all)")
