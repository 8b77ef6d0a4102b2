"""``lowbit quantize-tensor``: quantize one tensor from a file; bits, bytes and error."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

import lowbit
from lowbit.checkpoints.io.outputs import output_file, writer_metadata
from lowbit.cli import _common
from lowbit.errors import LowbitError
from lowbit.jobs.compare import load_tensor, scheme_for
from lowbit.quant.scheme import Scheme

__all__ = ["add_scheme_options", "build_scheme", "load_tensor", "register", "run",
           "save_quantized", "scheme_overrides"]  # fmt: skip

_EPILOG = """\
SOURCE is a .npy file or a tensor inside a .safetensors file (FILE.safetensors:NAME;
the name may be left out when the file holds one tensor).

--to takes a scheme string, FORMAT[:gN|:ch|:t][:SCALEFMT][:asym][:dq], as every lowbit command
does: with no granularity a format gets the weight layout (one scale per output channel, NF4
in blocks of 64, MX in blocks of 32); the options below change what the string says.

examples:
  lowbit quantize-tensor w.npy --to int4 --group 128 --scale-format fp16
  lowbit quantize-tensor w.npy --to int4:g128:fp16              the same scheme as one string
  lowbit quantize-tensor model.safetensors:layers.0.mlp.down_proj.weight --to nf4
  lowbit quantize-tensor w.npy --to int8                     per channel (rows)
  lowbit quantize-tensor w.npy --to int8:t                   one scale for the tensor
  lowbit quantize-tensor w.npy --to mxfp4 --out w_mxfp4.safetensors
  lowbit quantize-tensor w.npy --to int4 --group 64 --asym --scale-method mse --json

--out writes the codes, scales and zero points as safetensors arrays named
TENSOR.codes, TENSOR.scale, ... with the scheme in the file's metadata (key "lowbit"),
which lowbit.quant.quantized_tensor.QuantizedTensor.from_arrays reads back bit for bit. --out may not be
the source file; an existing --out needs --overwrite, which replaces only a file lowbit wrote.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "quantize-tensor",
        help="quantize one tensor (.npy or .safetensors) and report bits and error",
        description="Quantize one tensor and print its bits per value, bytes and the "
        "error it costs (MSE, SQNR, max abs, relative Frobenius, cosine).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE", help="FILE.npy or FILE.safetensors[:TENSOR]")
    add_scheme_options(p, required=True)
    p.add_argument("--out", metavar="OUT.safetensors", help="write the quantized tensor")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out file that lowbit wrote (anything else is refused)",
    )
    _common.add_json(p)
    p.set_defaults(func=run)


def add_scheme_options(
    p: argparse.ArgumentParser, required: bool, seed: bool = True, floats: str = "error"
) -> None:
    """Options that build a Scheme (shared with ``lowbit compare``).

    Args:
        p: the parser.
        required: whether ``--to`` is added (and required).
        seed: whether ``--seed`` is added.
        floats: what ``--asym`` and ``--restricted`` do to a float format, as the help says.
    """
    if required:
        p.add_argument(
            "--to",
            required=True,
            metavar="FORMAT",
            help="scheme: int4, int4:g128:fp16, nf4, mxfp4, fp8_e4m3:t, q4_0, ... "
            "(no granularity: per output channel)",
        )
    p.add_argument("--group", type=int, metavar="N", help="values per scale along --axis")
    p.add_argument(
        "--axis", type=int, metavar="A", help="channel axis, or the axis groups run along"
    )
    p.add_argument(
        "--scale-method",
        default=None,
        choices=["absmax", "percentile", "meanstd", "mse", "meanabs"],
        help="how each group's clipping range is chosen (default absmax)",
    )
    p.add_argument("--percentile", type=float, help="for --scale-method percentile (default 99.9)")
    p.add_argument("--k-std", type=float, help="for --scale-method meanstd (default 3)")
    p.add_argument("--scale-format", metavar="F", help="fp32 (default) | fp16 | bf16 | e8m0")
    p.add_argument(
        "--asym", action="store_true", help=f"integer formats: add a zero point (floats: {floats})"
    )
    p.add_argument(
        "--restricted",
        action="store_true",
        help=f"integers: symmetric range ±(2^(n-1)-1) (floats: {floats})",
    )
    p.add_argument("--double-quant", action="store_true", help="NF4: QLoRA double quantization")
    p.add_argument("--rounding", help="element rounding (default nearest_even; or stochastic)")
    if seed:
        p.add_argument("--seed", type=int, default=None, help="seed for stochastic rounding")


def scheme_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The Scheme fields the options set (None where an option was not given)."""
    return {
        "axis": args.axis,
        "group_size": args.group,
        "scale_method": args.scale_method,
        "percentile": args.percentile,
        "k_std": args.k_std,
        "scale_format": args.scale_format,
        "symmetric": False if args.asym else None,
        "restricted_range": True if args.restricted else None,
        "double_quant": True if args.double_quant else None,
        "rounding": args.rounding,
    }


def build_scheme(
    spec: str, args: argparse.Namespace, shape: tuple[int, ...], **overrides: Any
) -> Scheme:
    """The scheme ``spec`` with the options (and ``overrides``) applied, checked against the
    tensor's shape (:func:`lowbit.jobs.compare.scheme_for`).

    Raises:
        LowbitError: a bad scheme or option, a plain cast (nothing to scale), or per-channel
            scales on a tensor with no rows (unless ``--axis`` asks for them).
    """
    return scheme_for(spec, shape, **{**scheme_overrides(args), **overrides})


def save_quantized(
    qt: Any, name: str, out: str, *, overwrite: bool = False, inputs: tuple[str, ...] = ()
) -> None:
    """Write ``qt`` as safetensors, marked as lowbit's, through ``lowbit.checkpoints.io.outputs``
    (never over an input or a file lowbit did not write; swapped in complete; umask honoured).

    Raises:
        LowbitError: an empty path, an input as output, an existing file without ``overwrite``
            (or not lowbit's), a write error (disk full, read-only), named against ``out``.
    """
    try:
        from safetensors.numpy import save_file
    except ImportError:  # pragma: no cover
        raise ImportError("writing .safetensors needs: pip install 'lowbit[models]'") from None
    if not out.strip():
        raise LowbitError("--out is empty; give a .safetensors file to write")
    arrays, meta = qt.to_arrays(prefix=name + ".")
    with output_file(out, overwrite=overwrite, inputs=inputs) as tmp:
        save_file(
            dict(arrays),
            str(tmp),
            metadata={"lowbit": json.dumps({name: meta}), **writer_metadata()},
        )


def run(args: argparse.Namespace) -> int:
    import numpy as np

    arr, name = load_tensor(args.source)
    scheme = build_scheme(args.to, args, tuple(np.shape(arr)))
    qt = lowbit.quantize(arr, scheme, seed=args.seed)
    err = lowbit.error(arr, qt)
    orig_bytes = int(np.asarray(arr).nbytes)
    result = {
        "tensor": name,
        "shape": list(qt.shape),
        "dtype": str(np.asarray(arr).dtype),
        "scheme": qt.scheme.to_dict(),
        "label": qt.scheme.label,
        "bits_per_value": qt.bits_per_value,
        "bytes": qt.nbytes,
        "original_bytes": orig_bytes,
        "compression": orig_bytes / qt.nbytes,
        "error": err,
    }
    if args.out is not None:
        src = args.source
        source = src.partition(":")[0] if ".safetensors:" in src else src  # as load_tensor
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            save_quantized(qt, name, args.out, overwrite=args.overwrite, inputs=(source,))
        for w in caught:
            print(f"lowbit {args.command}: warning: {w.message}", file=sys.stderr)
        result["out"] = args.out
    if args.json:
        _common.print_json(result)
        return 0
    print(f"{name} {tuple(qt.shape)} {result['dtype']} -> {qt.scheme.label}")
    rows = [
        ["bits/value", f"{qt.bits_per_value:.4f}"],
        ["bytes", f"{qt.nbytes:,} (from {orig_bytes:,}: {result['compression']:.2f}x smaller)"],
        ["SQNR", f"{err['sqnr_db']:.2f} dB"],
        ["MSE", _common.fmt_num(err["mse"])],
        ["RMSE", _common.fmt_num(err["rmse"])],
        ["max |error|", _common.fmt_num(err["max_abs"])],
        ["rel. Frobenius", _common.fmt_num(err["rel_fro"])],
        ["cosine", f"{err['cosine']:.6f}"],
    ]
    _common.print_table(rows, ["quantity", "value"], align="ll")
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0
