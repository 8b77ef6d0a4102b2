"""Quantize tensors to scaled low-bit formats, and back: ``q = clamp(round(x/scale) + zp)``.

``quantize`` picks a scale per tensor, channel, group or MX block (``lowbit.quant.scheme``),
rounds ``x / scale`` with the element format's exact codec, and returns a
:class:`QuantizedTensor` holding bit-packed codes (``lowbit.codecs.packing``), scales and zero
points. Definitions, pinned by tests:

* **Integers**: ``q = clamp(round(x / s) + zp, qmin, qmax)`` where the rounding is of the
  *exact* quotient ``x / s`` (for float32/float16/bfloat16 inputs the float64 quotient
  rounds identically; the fast path divides in float32 and re-does, in float64, the
  rare elements whose float32 quotient lands exactly on a tie). Symmetric:
  ``s = clip / qmax`` with ``qmax = 2**(n-1) - 1``, ``zp = 0``. Asymmetric:
  ``s = (hi - lo) / (qmax - qmin)``, ``zp = clamp(round(qmin - lo / s))`` so that 0.0 is
  exactly the code ``zp``.
* **Scaled floats** (FP8/FP6/FP4): ``code = fmt.encode(x / s, saturate=True)`` with
  ``s = clip / fmt.max``, the quotient in float64.
* **Value sets**: NF4 as QLoRA (``s`` = absmax per block of 64, nearest table entry);
  binary/ternary with the mean-absolute scale (``lowbit.quant.scales.meanabs``).
* **MX**: ``lowbit.formats.mx`` (OCP MX v1.0 §6.3).
* The scale is rounded to ``scale_format`` first and the codes are computed with the
  rounded scale, so ``dequantize`` reproduces exactly what was encoded (NF4 double
  quantization is the one exception, as in QLoRA: ``lowbit.quant.nf4``).
* ``dequantize``: ``(value(q) - zp) * s`` rounded once to float32 (exact in float64 when
  ``dtype=float64`` is asked for).
"""

from __future__ import annotations

import warnings
from typing import Any, overload

import numpy as np

from lowbit._arrays import _is_ml_float, as_float64
from lowbit._parallel import map_chunks
from lowbit.errors import LowbitError, UnderflowError, UnderflowWarning
from lowbit.formats.base import Format
from lowbit.formats.catalog import format as lookup
from lowbit.formats.mx import is_mx_name
from lowbit.quant._engine import decode_tensor, encode_tensor
from lowbit.quant.ggml_tensor import (
    GgmlTensor,
    GgmlTypeName,
    block_type_name,
    mix_error,
    mix_name,
)
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.scheme import Scheme
from lowbit.quant.scheme_text import ALIASES, PRESETS, REFUSED, parse_scheme

_CHUNK = 1 << 16  # elements per chunk: a few hundred KiB of temporaries, cache-sized
_NAN_POLICIES = ("raise", "propagate")
_UNDERFLOW_POLICIES = ("warn", "raise", "ignore")


# ---- input -------------------------------------------------------------------------


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _as_input(x: Any) -> tuple[np.ndarray, bool]:
    """x as a C-contiguous float32 (when that is exact) or float64 array; was it torch?"""
    is_torch = _is_torch(x)
    if is_torch:
        t = x.detach().cpu()
        x = (
            t.numpy()
            if str(t.dtype) in ("torch.float32", "torch.float64", "torch.float16")
            else (t.float().numpy() if t.is_floating_point() else t.numpy())
        )
    arr = np.asarray(x) if isinstance(x, np.ndarray) else None
    if arr is None:
        arr = as_float64(x)
    if arr.dtype in (np.float32, np.float64):
        return _contiguous(arr), is_torch
    if arr.dtype.kind == "f" or arr.dtype.name in ("bfloat16",) or _is_ml_float(arr.dtype):
        if np.dtype(arr.dtype).itemsize <= 2:  # float16, bfloat16, float8: exact in float32
            return _widened(arr), is_torch
    return _contiguous(as_float64(arr)), is_torch


_WIDEN_CHUNK = 1 << 22  # values per chunk of _widened


def _widened(arr: np.ndarray) -> np.ndarray:
    """A 16- or 8-bit float array as float32 (exact), in chunks on the chunk threads: the
    first read of a memory-mapped source and the new array's pages are shared by the threads
    (an 8B model's NVFP4 write spent 39 % of its samples in one whole-tensor cast). bfloat16
    widens by its bits (``bits << 16`` is the float32 of every pattern, NaNs included)."""
    flat = arr.reshape(-1)
    out = np.empty(flat.size, dtype=np.float32)
    bf16 = arr.dtype.name == "bfloat16"

    def chunk(i: int) -> None:
        part, dst = flat[i : i + _WIDEN_CHUNK], out[i : i + _WIDEN_CHUNK]
        if bf16:
            np.left_shift(part.view(np.uint16), 16, out=dst.view(np.uint32), dtype=np.uint32)
        else:
            with np.errstate(invalid="ignore"):
                dst[:] = part.astype(np.float32)

    map_chunks(chunk, range(0, flat.size, _WIDEN_CHUNK))
    return out.reshape(arr.shape)


def _contiguous(a: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)


def _kw_defaults() -> dict[str, Any]:
    return {
        "axis": None,
        "group_size": None,
        "scale_method": None,
        "symmetric": True,
        "scale_format": "float32",
        "rounding": "nearest_even",
        "restricted_range": False,
        "percentile": 99.9,
        "k_std": 3.0,
        "double_quant": False,
        "granularity": None,
        "pad": True,
    }


def _plain_name(text: str) -> bool:
    """Whether ``text`` is a catalog format or MX name (quantized as the options say)."""
    name = text.strip().lower()
    if ":" in name:
        return False
    if is_mx_name(name):
        return True
    try:
        lookup(name)
    except LowbitError:
        return False
    return True


def _is_scheme_name(text: str) -> bool:
    """Whether ``text`` is a preset, alias or refused name of the scheme text form."""
    name = text.strip().lower()
    return name in PRESETS or name in ALIASES or name in REFUSED


# ---- public API --------------------------------------------------------------------


@overload
def quantize(x: Any, fmt: GgmlTypeName) -> GgmlTensor: ...


@overload
def quantize(
    x: Any,
    fmt: str | Format | Scheme,
    *,
    axis: int | None = None,
    group_size: int | None = None,
    scale_method: str | None = None,
    symmetric: bool = True,
    scale_format: str = "float32",
    rounding: str = "nearest_even",
    seed: Any = None,
    restricted_range: bool = False,
    percentile: float = 99.9,
    k_std: float = 3.0,
    double_quant: bool = False,
    nan: str = "raise",
    granularity: str | None = None,
    pad: bool = True,
    underflow: str = "warn",
    tensor_scale: Any = None,
) -> QuantizedTensor: ...


def quantize(
    x: Any,
    fmt: str | Format | Scheme,
    *,
    axis: int | None = None,
    group_size: int | None = None,
    scale_method: str | None = None,
    symmetric: bool = True,
    scale_format: str = "float32",
    rounding: str = "nearest_even",
    seed: Any = None,
    restricted_range: bool = False,
    percentile: float = 99.9,
    k_std: float = 3.0,
    double_quant: bool = False,
    nan: str = "raise",
    granularity: str | None = None,
    pad: bool = True,
    underflow: str = "warn",
    tensor_scale: Any = None,
) -> QuantizedTensor | GgmlTensor:
    """Quantize a tensor to a scaled low-bit format.

    ``lowbit.quantize([-0.5, 0.3, 1.2, -2.1], "int8")`` gives scale 2.1/127 and codes
    [-30, 18, 73, -127]; with ``"int4"``, scale 0.3 and codes [-2, 1, 4, -7].

    Args:
        x: array-like or torch tensor (any float dtype; never modified).
        fmt: a format name/alias, a catalog ``Format``, an MX name (``mxfp4``...), a
            :class:`~lowbit.quant.scheme.Scheme` (then the other options must be left default),
            or any scheme string ``lowbit quantize --to`` takes (``int4:g128``, ``nvfp4``,
            ``q4_0``: :func:`~lowbit.quant.scheme_text.parse_scheme`, the options given set
            on top of it). A bare format name keeps one scale per tensor unless the options
            say otherwise. llama.cpp's other block types (``q4_k``, ``q6_k``, ``iq4_xs``)
            give a :class:`~lowbit.quant.ggml_tensor.GgmlTensor` of llama.cpp's bytes; a
            llama.cpp mix (``q4_k_m``) is an error naming ``quantize_model``.
        axis: the channel axis (one scale per index along it), or with ``group_size`` the
            axis the groups run along (default -1).
        group_size: values per scale along ``axis``.
        scale_method: ``absmax`` (default), ``percentile``, ``meanstd``, ``mse``;
            ``meanabs`` (default for binary/ternary).
        symmetric: False gives integer formats a zero point (0.0 exact).
        scale_format: ``float32``, ``float16``, ``bfloat16`` or ``e8m0`` (scales are
            rounded to it before the values are encoded; e8m0 rounds up, so nothing
            clips that absmax would keep).
        rounding: element rounding (``nearest_even``, ``stochastic`` with ``seed``, ...).
        seed: seed or ``numpy.random.Generator`` for stochastic rounding.
        restricted_range: integers in -(2^(n-1)-1)..2^(n-1)-1.
        percentile, k_std: parameters of those scale methods.
        double_quant: NF4: 8-bit block scales in blocks of 256 (QLoRA).
        nan: ``"raise"`` (default) rejects NaN/inf input; ``"propagate"`` keeps them: a
            NaN (inf) becomes the format's NaN (inf) code where it has one, else its
            whole group's scale becomes NaN; scales come from the finite values.
        granularity: override the derived granularity (``tensor`` for per-tensor NF4).
        pad: True (default) lets the last group be shorter; False makes it an error.
        underflow: what to do when a tensor with nonzero values quantizes to all zeros
            (its scales reached the smallest value of their format, e.g. float64 input
            of 1e-300): ``"warn"`` (default) issues a
            :class:`~lowbit.errors.UnderflowWarning`, ``"raise"`` an
            :class:`~lowbit.errors.UnderflowError`, ``"ignore"`` neither.
        tensor_scale: two-level schemes (``nvfp4``) only: use this float32 tensor scale
            (encode direction) instead of the tensor's own, e.g. one shared by q/k/v
            (:func:`lowbit.quant.shared_scale.quantize_shared_tensor_scale`).

    Returns:
        A :class:`QuantizedTensor` (a :class:`~lowbit.quant.ggml_tensor.GgmlTensor` for a
        llama.cpp block type).

    Raises:
        LowbitError: empty input, a llama.cpp mix, options given with a block type, NaN/inf under ``nan="raise"``, axis out of range,
            a group size that does not divide with ``pad=False``, a format that cannot
            be scaled, a scale beyond its scale format's range (float32, float16,
            bfloat16, or E8M0 in MX blocks), bad options.
        UnderflowError: a nonzero tensor quantized to all zeros, under
            ``underflow="raise"``.

    Warns:
        UnderflowWarning: a nonzero tensor quantized to all zeros (``underflow="warn"``).
    """
    if nan not in _NAN_POLICIES:
        raise LowbitError(f"unknown NaN policy {nan!r}; allowed: 'raise', 'propagate'")
    if underflow not in _UNDERFLOW_POLICIES:
        raise LowbitError(
            f"unknown underflow policy {underflow!r}; allowed: 'warn', 'raise', 'ignore'"
        )
    given = {
        "axis": axis, "group_size": group_size, "scale_method": scale_method,
        "symmetric": symmetric, "scale_format": scale_format, "rounding": rounding,
        "restricted_range": restricted_range, "percentile": percentile, "k_std": k_std,
        "double_quant": double_quant, "granularity": granularity, "pad": pad,
    }  # fmt: skip
    changed = sorted(k for k, v in given.items() if v != _kw_defaults()[k])
    if isinstance(fmt, str) and not _plain_name(fmt):
        block = block_type_name(fmt)
        if block is not None:
            if changed or tensor_scale is not None:
                raise LowbitError(
                    f"{fmt!r} is llama.cpp's {block} block type, which takes no options "
                    f"(got {changed or ['tensor_scale']})"
                )
            return GgmlTensor.quantize(_as_input(x)[0], block)
        if mix_name(fmt) is not None:
            raise mix_error(fmt)
        if ":" in fmt or _is_scheme_name(fmt):
            parsed = parse_scheme(fmt, **{k: given[k] for k in changed})
            if not isinstance(parsed, Scheme):
                raise LowbitError(f"{fmt!r} is a plain cast, not a scaled scheme")
            fmt, changed = parsed, []
    if isinstance(fmt, Scheme):
        if changed:
            raise LowbitError(
                f"pass either a Scheme or options, not both (got a Scheme and {changed})"
            )
        scheme = fmt
    else:
        name = fmt.name if isinstance(fmt, Format) else fmt
        if isinstance(fmt, Format):
            try:
                found = lookup(fmt.name)
            except LowbitError:
                found = None
            if found != fmt:
                raise LowbitError(
                    f"format {fmt.name!r} is not the catalog's format of that name; "
                    "quantize takes catalog formats (their names are saved with the result)"
                )
        scheme = Scheme(
            format=name,
            granularity=granularity,  # type: ignore[arg-type]
            axis=axis,
            group_size=group_size,
            scale_method=scale_method,  # type: ignore[arg-type]
            symmetric=symmetric,
            scale_format=scale_format,
            rounding=rounding,
            restricted_range=restricted_range,
            percentile=percentile,
            k_std=k_std,
            double_quant=double_quant,
            pad=pad,
        )
    arr, is_torch = _as_input(x)
    if arr.size == 0:
        raise LowbitError(f"cannot quantize an empty tensor (shape {arr.shape})")
    if tensor_scale is not None:
        g = np.float32(tensor_scale)
        if not scheme.tensor_scale:
            raise LowbitError(f"{scheme.label} has no tensor scale; tensor_scale= is for nvfp4")
        if not (np.isfinite(g) and g > 0):
            raise LowbitError(
                f"tensor_scale must be a positive finite float32, got {tensor_scale!r}"
            )
        tensor_scale = g
    enc = encode_tensor(arr, scheme, seed=seed, nan=nan, tensor_scale=tensor_scale)
    qt = QuantizedTensor(
        codes=enc.codes,
        scale=enc.scale,
        zero_point=enc.zero_point,
        shape=arr.shape,
        scheme=scheme,
        dq=enc.dq,
        source_torch=is_torch,
        ts=enc.ts,
    )
    if enc.floored and underflow != "ignore":
        _check_underflow(arr, qt, underflow)
    return qt


def quantize_dynamic(x: Any, fmt: str = "int8", *, axis: int = -1) -> QuantizedTensor:
    """Per-token dynamic quantization for activations: one scale per row.

    Every slice along ``axis`` (the hidden dimension; -1 for ``[tokens, hidden]`` or
    ``[batch, seq, hidden]``) gets its own absmax scale, computed now from the values
    themselves (a group as long as the axis).

    Raises:
        LowbitError: as :func:`quantize`.
    """
    arr, _ = _as_input(x)
    if arr.ndim == 0:
        raise LowbitError("quantize_dynamic needs at least a 1-d tensor")
    nd = arr.ndim
    if not -nd <= axis < nd:
        raise LowbitError(f"axis {axis} is out of range for a tensor of shape {arr.shape}")
    length = arr.shape[axis]
    if length == 0:
        raise LowbitError(f"cannot quantize an empty tensor (shape {arr.shape})")
    return quantize(x, fmt, axis=axis, group_size=length)


def dequantize(qt: QuantizedTensor | GgmlTensor, dtype: Any = np.float32) -> Any:
    """Values of a :class:`QuantizedTensor` (see :meth:`QuantizedTensor.dequantize`) or of a
    :class:`~lowbit.quant.ggml_tensor.GgmlTensor` (llama.cpp's decoding)."""
    if not isinstance(qt, (QuantizedTensor, GgmlTensor)):
        raise LowbitError(f"dequantize takes a QuantizedTensor, got {type(qt).__name__}")
    return qt.dequantize(dtype)


# ---- the result ---------------------------------------------------------------------


def _check_underflow(arr: np.ndarray, qt: QuantizedTensor, policy: str) -> None:
    """Warn (or raise, under ``policy="raise"``) when a nonzero tensor became all zeros."""
    nonzero = int(np.count_nonzero(arr))
    if nonzero == 0 or np.any(
        decode_tensor(qt.codes, qt.scale, qt.zero_point, qt.shape, qt.scheme, np.float64) != 0
    ):
        return
    with np.errstate(invalid="ignore"):
        amax = float(np.nanmax(np.abs(arr)))
    msg = (
        f"{qt.scheme.label}: all {qt.numel:,} values quantized to zero though {nonzero:,} "
        f"are nonzero (largest |x| {amax:.4g}): the {qt.scheme.scale_format} scales "
        "underflowed to their smallest value; scale the input up first (underflow='ignore' "
        "silences this, 'raise' makes it an error)"
    )
    if policy == "raise":
        raise UnderflowError(msg)
    warnings.warn(msg, UnderflowWarning, stacklevel=3)  # the caller of lowbit.quantize


__all__ = [
    "QuantizedTensor",
    "dequantize",
    "quantize",
    "quantize_dynamic",
]
