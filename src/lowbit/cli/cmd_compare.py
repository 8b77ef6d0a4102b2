"""``lowbit compare``: several quantization choices on the same data, ranked by SQNR."""

from __future__ import annotations

import argparse
from typing import Any

from lowbit.checkpoints.io.outputs import save_figure
from lowbit.cli import _common
from lowbit.cli._payloads import COMPARE_DEFAULT_FORMATS, compare_payload
from lowbit.cli.cmd_quantize_tensor import add_scheme_options
from lowbit.errors import LowbitError
from lowbit.view.labels import place_labels

#: The list compared when --formats is not given (one scale per tensor: 1-D data).
DEFAULT_FORMATS = COMPARE_DEFAULT_FORMATS

_EPILOG = """\
Each entry of --formats is a scheme string, FORMAT[:gN|:ch|:t][:SCALEFMT][:asym][:dq], read
as every lowbit command reads it: with no granularity a format gets the weight layout (one
scale per output channel, NF4 in blocks of 64), so on 1-D data write :t (one scale) or :gN.
The options (--group, --scale-method, ...) apply to every entry, except that MX formats keep
their blocks of 32 and E8M0 scales, and --double-quant applies to NF4 only. --asym and
--restricted apply to the integer entries of the default list (its floats stay as they
are) and are errors for a float format you name in --formats. Rows are sorted by SQNR
(higher is better).

examples:
  lowbit compare                                     the default six on N(0,1) data
  lowbit compare --group 64                          4-bit formats at block 64
  lowbit compare --asym                              the defaults, integers with a zero point
  lowbit compare --formats int4,nf4 --group 64 --data laplace
  lowbit compare --data w.npy --formats int8,int4,nf4 --group 128
  lowbit compare --data model.safetensors:lm_head.weight --plot out.png
  lowbit compare --plot out.png --levels nf4         histogram with NF4's levels
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="compare formats and scale choices on the same data (bits/value vs error)",
        description="Quantize the same data with several formats and print one table of "
        "bits per value and error, sorted by SQNR.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--formats",
        default=None,
        help=f"comma-separated (default {DEFAULT_FORMATS}; --asym and --restricted change only "
        "its integer entries)",
    )
    p.add_argument(
        "--data",
        default="normal",
        metavar="SOURCE",
        help="normal | laplace | student-t | uniform | FILE.npy | FILE.safetensors[:TENSOR]",
    )
    p.add_argument(
        "--size", type=int, default=1 << 18, help="values of synthetic data (default 262144)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of synthetic data and stochastic rounding"
    )
    add_scheme_options(
        p,
        required=False,
        seed=False,
        floats="left as they are in the default list, an error when named in --formats",
    )
    p.add_argument(
        "--plot", metavar="OUT.png", help="draw error vs bits/value and a histogram (matplotlib)"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing --plot file lowbit drew"
    )
    p.add_argument(
        "--levels",
        metavar="FORMAT",
        help="format whose levels the histogram shows (default: the first)",
    )
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    payload, qts, data = compare_payload(args)
    label, results, rows = payload["data"], payload["results"], []
    names = list(qts)
    if args.plot is not None:
        _plot(args.plot, data, results, qts, args.levels or names[0], args.overwrite)
    if args.json:
        _common.print_json({**payload, "plot": args.plot})
        return 0
    print(f"data: {label}")
    for r in results:
        rows.append(
            [
                r["scheme"],
                f"{r['bits_per_value']:.3f}",
                f"{r['sqnr_db']:.2f}",
                _common.fmt_num(r["rmse"], 4),
                _common.fmt_num(r["max_abs"], 4),
                _common.fmt_num(r["rel_fro"], 4),
                f"{r['cosine']:.6f}",
            ]
        )
    _common.print_table(
        rows, ["scheme", "bits/value", "SQNR dB", "RMSE", "max |err|", "rel. Frob.", "cosine"],
        align="lrrrrrr",
    )  # fmt: skip
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def _levels(qt: Any) -> Any:
    """The values the first group of ``qt`` can take (scaled element values)."""
    import numpy as np

    fmt = qt.format
    vals = fmt.values().astype(np.float64) if fmt.bits <= 16 else np.array([])
    s = float(qt.scale.reshape(-1)[0])
    zp = float(qt.zero_point.reshape(-1)[0]) if qt.zero_point is not None else 0.0
    return (vals - zp) * s


def _plot(
    path: str,
    data: Any,
    results: list[dict[str, Any]],
    qts: dict[str, Any],
    levels: str,
    overwrite: bool,
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'lowbit[plot]'") from None
    import numpy as np

    if levels not in qts:
        raise LowbitError(f"--levels {levels!r} is not one of --formats ({', '.join(qts)})")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))

    for r in results:
        ax1.scatter(r["bits_per_value"], r["sqnr_db"], color="C0")
    points = [(r["bits_per_value"], r["sqnr_db"]) for r in results]
    offsets = place_labels(points, ax1, [r["scheme"] for r in results])
    for r, (dx, dy) in zip(results, offsets, strict=True):
        ax1.annotate(r["scheme"], (r["bits_per_value"], r["sqnr_db"]), fontsize=8,
                     xytext=(dx, dy), textcoords="offset points",
                     ha="left" if dx > 0 else "right")  # fmt: skip
    ax1.set_xlabel("bits per value (incl. scales)")
    ax1.set_ylabel("SQNR (dB)")
    ax1.set_title("error against storage (up and left is better)")
    ax1.scatter([], [], color="C0", label="one scheme (labelled)")
    ax1.legend(loc="lower right", fontsize=8)
    ax1.grid(alpha=0.3)
    flat = np.asarray(data, dtype=np.float64).reshape(-1)
    flat = flat[np.isfinite(flat)]
    ax2.hist(flat, bins=200, color="0.6", label="data")
    qt = qts[levels]
    lv = _levels(qt)
    lo, hi = np.percentile(flat, [0.01, 99.99]) if flat.size else (-1, 1)
    span = max(abs(lo), abs(hi), float(np.max(np.abs(lv))) if lv.size else 0.0)
    for k, v in enumerate(lv):
        ax2.axvline(v, color="C3", lw=0.6, alpha=0.8, label="levels" if k == 0 else None)
    ax2.set_xlim(-1.05 * span, 1.05 * span)
    ax2.set_title(f"data with the levels of {qt.scheme.label} (first group)")
    ax2.set_xlabel("value")
    ax2.set_ylabel("count")
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    try:
        save_figure(fig, path, overwrite=overwrite, dpi=120)
    finally:
        plt.close(fig)
