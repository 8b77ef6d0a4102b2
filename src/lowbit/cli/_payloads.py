"""The JSON documents of ``lowbit show/decode/values/compare --json``, built in one place.

The commands print them; ``lowbit explore``'s server (:mod:`lowbit.cli._explore_server`) answers its
requests with the same functions, so the page and the terminal can never disagree.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from lowbit.enums import as_rounding
from lowbit.formats import explain
from lowbit.formats.catalog import FORMATS
from lowbit.formats.catalog import format as get_format
from lowbit.jobs.compare import DEFAULT_FORMATS, DISTRIBUTIONS, compare

__all__ = [
    "COMPARE_DEFAULT_FORMATS",
    "DISTRIBUTIONS",
    "SHOW_FORMATS",
    "compare_payload",
    "decode_payload",
    "show_payload",
    "values_payload",
]

#: ``lowbit compare``'s list when ``--formats`` is not given. One scale per tensor for the
#: scaled formats: the synthetic data is one 1-D vector.
COMPARE_DEFAULT_FORMATS = DEFAULT_FORMATS


#: The formats ``lowbit show`` lists when ``--formats`` is not given.
SHOW_FORMATS = (
    "float32",
    "tensorfloat32",
    "bfloat16",
    "float16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float6_e3m2fn",
    "float6_e2m3fn",
    "float4_e2m1fn",
    "float8_e8m0fnu",
    "int8",
    "int4",
    "nf4",
)


def show_payload(
    value: str,
    names: list[str] | None = None,
    *,
    rounding: str = "nearest_even",
    saturate: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """``lowbit show VALUE --json``: one value rounded once to each format.

    Args:
        value: the number as typed (decimal, hex float, fraction, inf, nan, -0).
        names: format names or aliases, ``["all"]`` for the catalog; None: :data:`SHOW_FORMATS`.
        rounding: a rounding mode name.
        saturate: clamp overflow to ±max.
        seed: the seed of stochastic rounding.

    Returns:
        ``{"input", "float64", "float64_exact", "float64_hex", "rounding", "saturate",
        "results": [explain.convert(...) per format]}``.

    Raises:
        LowbitError: a value that is no number, an unknown format or rounding mode.
    """

    x = explain.parse_value(value)
    mode = as_rounding(rounding)
    names = list(names) if names else list(SHOW_FORMATS)
    if [n.lower() for n in names] == ["all"]:
        names = list(FORMATS)
    formats = [get_format(n) for n in names]  # unknown names fail here, before output
    results = [explain.convert(x, f, rounding=mode, saturate=saturate, seed=seed) for f in formats]
    return {
        "input": value,
        "float64": x,
        "float64_exact": explain.exact_decimal(x),
        "float64_hex": x.hex(),
        "rounding": mode.value,
        "saturate": saturate,
        "results": results,
    }


def decode_payload(fmt: str, code: str | int) -> dict[str, Any]:
    """``lowbit decode FORMAT CODE --json``: one bit pattern's value, class, fields, formula.

    Raises:
        LowbitError: an unknown format or a code that is not one of its codes.
    """

    return explain.decode(fmt, code)


def values_payload(fmt: str) -> dict[str, Any]:
    """``lowbit values FORMAT --json``: every code of a format of at most 8 bits.

    Returns:
        ``{"format", "bits", "codes", "finite_count", "distinct_values", "values": finite
        entries by ascending value (-0 before +0), "non_finite": the inf and NaN codes}``.

    Raises:
        LowbitError: an unknown format, or one wider than 8 bits.
    """

    f = get_format(fmt)
    entries = explain.values(f)
    finite = sorted(
        (d for d in entries if d["finite"]),
        key=lambda d: (d["value"], math.copysign(1.0, d["value"])),
    )
    return {
        "format": f.name,
        "bits": f.bits,
        "codes": len(entries),
        "finite_count": len(finite),
        "distinct_values": len({d["value"] for d in finite}),
        "values": finite,
        "non_finite": [d for d in entries if not d["finite"]],
    }


def compare_payload(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """``lowbit compare --json``: :func:`lowbit.compare` with the parsed options.

    Returns:
        ``(payload, quantized tensors by --formats entry, the data)``; the payload is
        ``{"data": label, "results": [{"format", "scheme", "bits_per_value", "bytes", and
        lowbit.error's metrics}]}``.

    Raises:
        LowbitError: an unknown distribution or missing file, an empty or bad --formats.
    """
    res = compare(
        args.data, args.formats, size=args.size, seed=args.seed, group_size=args.group,
        axis=args.axis, scale_method=args.scale_method, percentile=args.percentile,
        k_std=args.k_std, scale_format=args.scale_format, asym=args.asym,
        restricted=args.restricted, double_quant=args.double_quant, rounding=args.rounding,
    )  # fmt: skip
    return (
        {"data": res.label, "results": [dict(r) for r in res.rows]},
        dict(res.quantized),
        res.data,
    )
