"""The JSON documents of ``lowbit show/decode/values/compare --json``, built in one place.

The commands print them; ``lowbit explore``'s server (:mod:`lowbit.cli._explore_server`) answers its
requests with the same functions, so the page and the terminal can never disagree.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.cli import _common
from lowbit.cli.cmd_quantize_tensor import build_scheme, load_tensor
from lowbit.enums import as_rounding
from lowbit.errors import LowbitError
from lowbit.formats import explain
from lowbit.formats.catalog import FORMATS
from lowbit.formats.catalog import format as get_format
from lowbit.formats.mx import is_mx_name
from lowbit.quant.metrics import error
from lowbit.quant.tensor import quantize

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
COMPARE_DEFAULT_FORMATS = "int8:t,int4:t,nf4,fp4:t,mxfp4,fp8_e4m3:t"

#: The synthetic data ``lowbit compare --data`` draws.
DISTRIBUTIONS = ("normal", "laplace", "student-t", "uniform")

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
    """``lowbit compare --json``: the same data quantized with each scheme, by falling SQNR.

    Args:
        args: the parsed ``lowbit compare`` options (``formats``, ``data``, ``size``,
            ``seed`` and the scheme options).

    Returns:
        ``(payload, quantized tensors by --formats entry, the data)``; the payload is
        ``{"data": label, "results": [{"format", "scheme", "bits_per_value", "bytes", and
        lowbit.error's metrics}]}``.

    Raises:
        LowbitError: an unknown distribution or missing file, an empty or bad --formats.
    """

    if args.data in DISTRIBUTIONS:
        data = make_data(args.data, args.size, args.seed)
        label = f"{args.data} (n={data.size:,}, seed {args.seed})"
    else:
        src = args.data
        file = src.partition(".safetensors:")[0] + ".safetensors" if ".safetensors:" in src else src
        if not Path(file).exists():
            raise LowbitError(
                f"--data {args.data!r} is neither a distribution ({', '.join(DISTRIBUTIONS)}) "
                "nor an existing .npy / .safetensors file"
            )
        data, name = load_tensor(args.data)
        label = f"{name} {tuple(np.shape(data))}"
    explicit = args.formats is not None
    names = _common.parse_list(args.formats if explicit else COMPARE_DEFAULT_FORMATS)
    if not names:
        raise LowbitError("--formats is empty")
    results = []
    qts = {}
    shape = tuple(np.shape(data))
    schemes = {name: _scheme_for(name, args, shape, explicit) for name in names}
    for name in names:
        qt = quantize(data, schemes[name], seed=args.seed)
        err = error(data, qt)
        qts[name] = qt
        results.append(
            {
                "format": name,
                "scheme": qt.scheme.label,
                "bits_per_value": qt.bits_per_value,
                "bytes": qt.nbytes,
                **err,
            }
        )
    results.sort(key=lambda r: -r["sqnr_db"])
    return {"data": label, "results": results}, qts, data


def make_data(kind: str, size: int, seed: int) -> Any:
    """Synthetic data: ``size`` float32 values from a named distribution (unit scale)."""
    if size < 1:
        raise LowbitError(f"--size must be >= 1, got {size}")
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(size)
    elif kind == "laplace":
        x = rng.laplace(0.0, 1.0, size)
    elif kind == "student-t":
        x = rng.standard_t(4.0, size)
    elif kind == "uniform":
        x = rng.uniform(-1.0, 1.0, size)
    else:
        raise LowbitError(f"unknown distribution {kind!r}; allowed: {', '.join(DISTRIBUTIONS)}")
    return x.astype(np.float32)


def _scheme_for(
    name: str, args: argparse.Namespace, shape: tuple[int, ...], explicit: bool = True
) -> Any:
    """The scheme of one --formats entry with the shared options applied.

    Args:
        name: the --formats entry.
        args: the parsed options.
        shape: the data's shape.
        explicit: whether the user named the list; with the default list, ``--asym`` and
            ``--restricted`` apply to its (signed) integer entries only, so that the default
            list with ``--asym`` compares the integers asymmetric beside the floats.

    Returns:
        The scheme.

    Raises:
        LowbitError: a bad entry, or an option the entry's format cannot take (for an
            explicit list, ``--asym`` or ``--restricted`` with a float format).
    """
    skip: dict[str, Any] = {}
    if is_mx_name(name.split(":")[0].strip()):
        skip = {"group_size": None, "scale_format": None, "scale_method": None}
    if name.split(":")[0].strip().lower() != "nf4":
        skip["double_quant"] = None
    if not explicit and (args.asym or args.restricted):
        fmt = build_scheme(name, args, shape, symmetric=None, restricted_range=None, **skip)
        fmt = fmt.element_format
        if fmt.kind != "int":
            skip["symmetric"] = None
        if fmt.kind != "int" or not getattr(fmt, "signed", False):
            skip["restricted_range"] = None
    return build_scheme(name, args, shape, **skip)
