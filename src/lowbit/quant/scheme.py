"""Quantization schemes: format, granularity, scale method; frozen, typed, JSON round-trip.

A :class:`Scheme` says everything ``lowbit.quantize`` needs to turn a tensor into codes
and scales; ``Scheme.to_dict`` / ``Scheme.from_dict`` round-trip it through JSON with a
``version``. Fields left out are derived sensibly: ``group_size`` implies per-group
scales, ``axis`` alone per-channel scales, an ``mx*`` format the OCP MX block layout
(32 values along the last axis), ``nf4`` QLoRA's blocks of 64, and ``binary`` /
``ternary`` the mean-absolute scale of BNN/TWN work.

A Scheme also knows what it costs to store (:meth:`Scheme.n_scales`,
:meth:`Scheme.tensor_bytes`, :attr:`Scheme.bits_per_value`): the planner prices models with
the same objects the quantizer quantizes with, and :attr:`Scheme.label` is the one short text
form (``int4:g128:fp16:asym``; :mod:`lowbit.quant.scheme_text` parses it back). A
:class:`Cast` (``bf16``, ``fp16``, ``fp32``) stores values in a plain float type with no
scale: it has the same storage protocol but is not a Scheme, since nothing is scaled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any

from lowbit.enums import as_rounding
from lowbit.errors import LowbitError, UnknownFormatError
from lowbit.formats.base import Format
from lowbit.formats.catalog import format as _lookup
from lowbit.formats.catalog import mx_format
from lowbit.formats.mx import is_mx_name
from lowbit.quant._scheme_checks import (
    DEFAULT_TILE,
    MX_SCALE_RULES,
    SCALE_FORMATS,
    _enum,
    canonical_scale_format,
    check_rule,
    check_tile,
    check_two_level,
    require,
    tile_grid,
)
from lowbit.quant.nf4 import DQ_BLOCK, NF4_BLOCK

__all__ = [
    "CAST_FORMATS",
    "DEFAULT_TILE",
    "DQ_BLOCK",
    "GGML_NAMES",
    "MX_SCALE_RULES",
    "SCALE_FORMATS",
    "SCHEME_VERSION",
    "Cast",
    "Granularity",
    "ScaleMethod",
    "Scheme",
    "canonical_scale_format",
    "short_name",
    "tile_grid",
]

SCHEME_VERSION = 1

#: Formats a plain cast (no scale) may store, with their safetensors dtype names.
CAST_FORMATS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# QLoRA double quantization (lowbit.quant.nf4): each block scale becomes an index into the
# 256-entry dynamic map (a uint8 code), with one float32 absmax per DQ_BLOCK codes and one
# float32 mean offset per tensor.
_DQ_CODE_FORMAT = "uint8"
_DQ_STATE_FORMAT = "float32"

# The names labels use: the short names people type, where the catalog has one.
_SHORT = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
          "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "float6_e3m2fn": "fp6_e3m2",
          "float6_e2m3fn": "fp6_e2m3", "float4_e2m1fn": "fp4", "float8_e8m0fnu": "e8m0",
          "tensorfloat32": "tf32"}  # fmt: skip


def short_name(name: str) -> str:
    """The name a label shows for a canonical format name (``float16`` -> ``fp16``)."""
    return _SHORT.get(name, name)


def _bits(name: str) -> int:
    """Bits one stored value of a catalog format occupies (TF32: its 32-bit container)."""
    fmt = _lookup(name)
    return int(getattr(fmt, "container", None) or fmt.bits)


class Granularity(str, Enum):
    """Which values share one scale.

    ``tensor``: the whole tensor. ``channel``: every index along ``axis``.
    ``group``: ``group_size`` consecutive values along ``axis``. ``block``: an OCP MX
    block of 32 values along ``axis`` with a power-of-two E8M0 scale. ``tile``: 2-D blocks of
    ``block_shape`` (rows, columns) over a weight ``[out, in]`` (DeepSeek-V3's and
    compressed-tensors' FP8 blocks, 128x128 by default); the last tiles may be partial.
    """

    TENSOR = "tensor"
    CHANNEL = "channel"
    GROUP = "group"
    BLOCK = "block"
    TILE = "tile"


class ScaleMethod(str, Enum):
    """How the clipping range (and so the scale) of each group is chosen.

    ``absmax``: the largest magnitude ("max quantization"; nothing clips).
    ``percentile``: the ``percentile``-th percentile of |x| (or of x, both tails, when
    asymmetric). ``meanstd``: |mean| + ``k_std`` standard deviations.
    ``mse``: the clipping ratio of absmax (searched on a grid, per group) that minimises
    the squared error. ``meanabs``: the mean of |x| (BNN/XNOR-Net for binary; TWN for
    ternary: threshold 0.7·mean|x|, scale = mean |x| above it). ``ggml``: llama.cpp's
    Q4_0/Q5_0/Q8_0 rounding (ggml's reference quantizers: Q4_0/Q5_0 map the block's
    largest-magnitude value to code -8/-16 and round half up; Q8_0 uses ``max|x|/127`` and
    rounds half away from zero; both compute codes with the float32 scale before storing it
    as float16), for int4/int5/int8 in groups of 32 along the last axis with float16 scales:
    the schemes ``q4_0``, ``q5_0``, ``q8_0`` (:data:`GGML_NAMES`).
    """

    ABSMAX = "absmax"
    PERCENTILE = "percentile"
    MSE = "mse"
    MEANSTD = "meanstd"
    MEANABS = "meanabs"
    GGML = "ggml"


#: llama.cpp's block type of each element format under ``scale_method="ggml"``: the label
#: such a scheme has (``q4_0`` is ``int4:g32:fp16:ggml``; ``int4:g32:fp16`` is lowbit's own
#: absmax rounding, which differs in most blocks).
GGML_NAMES = {"int4": "q4_0", "int5": "q5_0", "int8": "q8_0"}


@dataclass(frozen=True, kw_only=True)
class Scheme:
    """How to quantize a tensor: element format, granularity, scale choice and storage.

    Args:
        format: catalog name or alias (``int4``, ``fp8_e4m3``, ``nf4``, ...) or an MX
            block format (``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e3m2``, ``mxfp6_e2m3``,
            ``mxfp4``, ``mxint8``).
        granularity: derived when omitted: ``group_size`` -> group, ``axis`` -> channel,
            ``mx*`` -> block, ``nf4`` -> group of 64 (QLoRA), else tensor.
        axis: channel axis (one scale per index; weights ``[out, in]`` use 0), or the axis
            groups/blocks run along (default -1).
        group_size: values per group (block: 32, fixed by OCP MX).
        scale_method: see :class:`ScaleMethod`; default absmax (meanabs for binary/ternary).
        percentile: for ``percentile`` (0 < p <= 100).
        k_std: for ``meanstd``.
        symmetric: False gives integer formats a zero point (0.0 stays exact).
        restricted_range: integers use -(2^(n-1)-1)..2^(n-1)-1.
        scale_format: ``float32`` | ``float16`` | ``bfloat16`` | ``float8_e8m0fnu`` (MX).
        double_quant: NF4 only: 8-bit block scales in blocks of 256 (QLoRA §3).
        rounding: element rounding mode (``nearest_even``, ..., ``stochastic``).
        pad: True handles a last group shorter than ``group_size``; False makes it an error.
        tensor_scale: NVFP4's two-level scales: a float32 tensor scale ``g = 448 * max /
            amax(tensor)`` (compressed-tensors' encode direction) over E4M3 group scales
            ``RNE(g * amax(group) / max)``; a value is ``code * group_scale / g``
            (``lowbit.quant._choose``; groups, e4m3 scales, absmax, a float format).
        scale_rule: MX formats only: how the E8M0 scale is chosen (:data:`MX_SCALE_RULES`,
            default ``floor``, OCP's).
        block_shape: ``(rows, columns)`` of ``tile`` granularity (default ``(128, 128)``);
            ``scale_format="e8m0"`` makes tile scales powers of two (rounded up).
    """

    format: str
    granularity: Granularity | None = None  # type: ignore[assignment]
    axis: int | None = None
    group_size: int | None = None
    scale_method: ScaleMethod | None = None  # type: ignore[assignment]
    percentile: float = 99.9
    k_std: float = 3.0
    symmetric: bool = True
    restricted_range: bool = False
    scale_format: str = "float32"
    double_quant: bool = False
    rounding: str = "nearest_even"
    pad: bool = True
    tensor_scale: bool = False
    scale_rule: str | None = None
    block_shape: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not isinstance(self.format, str):
            set_(self, "format", getattr(self.format, "name", str(self.format)))
        name = self.format.strip().lower()
        mx = is_mx_name(name)
        if mx:
            name = mx_format(name).name
        else:
            try:
                name = _lookup(name).name
            except UnknownFormatError as exc:
                if ":" not in name:
                    raise
                raise UnknownFormatError(
                    f"{exc}; lowbit.parse_scheme({self.format!r}) reads a scheme string"
                ) from None
        set_(self, "format", name)
        set_(self, "rounding", as_rounding(self.rounding).value)
        if self.axis is not None:
            if not isinstance(self.axis, (int,)) or isinstance(self.axis, bool):
                raise LowbitError(f"axis must be an integer, got {self.axis!r}")
        if self.group_size is not None:
            if isinstance(self.group_size, bool) or not isinstance(self.group_size, int):
                raise LowbitError(f"group_size must be a positive integer, got {self.group_size!r}")
            if self.group_size < 1:
                raise LowbitError(f"group_size must be >= 1, got {self.group_size}")

        gran = self.granularity
        if gran is None:
            if mx:
                gran = Granularity.BLOCK
            elif self.group_size is not None:
                gran = Granularity.GROUP
            elif self.axis is not None:
                gran = Granularity.CHANNEL
            elif name == "nf4":
                gran = Granularity.GROUP
                set_(self, "group_size", NF4_BLOCK)
            else:
                gran = Granularity.TENSOR
        gran = _enum(Granularity, gran, "granularity")
        set_(self, "granularity", gran)
        bs = check_tile(self.block_shape, gran.value, self.axis, self.group_size, name, mx)
        set_(self, "block_shape", bs)

        rule = check_rule(self.scale_rule, name, mx)
        set_(self, "scale_rule", rule)
        set_(self, "tensor_scale", bool(self.tensor_scale))

        if gran is Granularity.BLOCK:
            if not mx:
                raise LowbitError(
                    f"block granularity is the OCP MX layout: use an mx format "
                    f"(mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4, mxint8), not {name!r}"
                )
            if self.group_size not in (None, 32):
                raise LowbitError(
                    f"MX blocks are 32 values (OCP MX v1.0), got group_size={self.group_size}"
                )
            set_(self, "group_size", 32)
            if self.axis is None:
                set_(self, "axis", -1)
        elif mx:
            raise LowbitError(
                f"{name} is an MX block format: its granularity is 'block', not {gran.value!r}"
            )
        elif gran is Granularity.GROUP:
            if self.group_size is None:
                raise LowbitError("group granularity needs group_size")
            if self.axis is None:
                set_(self, "axis", -1)
        elif gran is Granularity.CHANNEL:
            if self.group_size is not None:
                raise LowbitError("channel granularity takes axis, not group_size")
            if self.axis is None:
                set_(self, "axis", 0)
        elif gran is Granularity.TILE:
            if not self.symmetric:
                raise LowbitError("tiles are symmetric (no zero points), as FP8 blocks are")
        else:  # tensor
            if self.group_size is not None or self.axis is not None:
                raise LowbitError("tensor granularity takes neither axis nor group_size")

        method = self.scale_method
        if method is None:
            method = _default_method(name)
        method = _enum(ScaleMethod, method, "scale method")
        set_(self, "scale_method", method)
        if method is ScaleMethod.GGML:
            ggml = {"format": name in GGML_NAMES, "granularity": gran is Granularity.GROUP,
                    "group_size": self.group_size == 32, "axis": self.axis == -1,
                    "scale_format": canonical_scale_format(self.scale_format) == "float16",
                    "symmetric": self.symmetric, "restricted_range": not self.restricted_range,
                    "rounding": self.rounding == "nearest_even"}  # fmt: skip
            require(ggml, "scale_method 'ggml' is llama.cpp's Q4_0/Q5_0/Q8_0 rounding: int4, int5 "
                    "or int8 in groups of 32 along axis -1 with float16 scales, symmetric, "
                    "nearest rounding (write q4_0, q5_0 or q8_0)")  # fmt: skip
        if mx and method is not ScaleMethod.ABSMAX:
            raise LowbitError(
                "MX formats choose their scale as OCP MX v1.0 §6.3 says: scale_method must be absmax"
            )
        if not 0 < float(self.percentile) <= 100:
            raise LowbitError(f"percentile must be in (0, 100], got {self.percentile}")
        if not float(self.k_std) > 0:
            raise LowbitError(f"k_std must be > 0, got {self.k_std}")
        set_(self, "percentile", float(self.percentile))
        set_(self, "k_std", float(self.k_std))

        sf = "float8_e8m0fnu" if mx else canonical_scale_format(self.scale_format)
        if mx and canonical_scale_format(self.scale_format) not in ("float32", "float8_e8m0fnu"):
            raise LowbitError(
                f"MX scales are E8M0 (OCP MX v1.0); scale_format={self.scale_format!r} is not allowed"
            )
        set_(self, "scale_format", sf)

        fmt = self.element_format
        if not self.symmetric and fmt.kind != "int":
            raise LowbitError(
                f"asymmetric quantization (a zero point) needs an integer format, not {fmt.name}"
            )
        if self.restricted_range and (fmt.kind != "int" or not getattr(fmt, "signed", False)):
            raise LowbitError(f"restricted_range applies to signed integer formats, not {fmt.name}")
        if self.double_quant and name != "nf4":
            raise LowbitError(f"double_quant is QLoRA's NF4 option; {name} does not take it")
        if self.double_quant and self.scale_format != "float32":
            raise LowbitError(
                "double_quant compresses float32 block scales: keep scale_format='float32'"
            )
        if fmt.kind == "float" and getattr(fmt, "bits", 0) > 16 and not mx:
            raise LowbitError(f"{fmt.name} is too wide to be a scaled element format")
        if fmt.kind == "float" and not getattr(fmt, "signed", True):
            raise LowbitError(f"{fmt.name} is unsigned and has no zero: it cannot be scaled")
        if fmt.kind == "int" and fmt.bits > 16:
            raise LowbitError(f"{fmt.name} is too wide to quantize to (at most 16 bits)")
        check_two_level(self.tensor_scale, sf, {
            "granularity": gran is Granularity.GROUP, "scale_format": sf == "float8_e4m3fn",
            "scale_method": method is ScaleMethod.ABSMAX, "symmetric": self.symmetric,
            "format": fmt.kind == "float", "rounding": self.rounding == "nearest_even"})  # fmt: skip

    # ---- derived -------------------------------------------------------------------

    @property
    def is_mx(self) -> bool:
        """Whether this is an OCP MX block format."""
        return self.granularity is Granularity.BLOCK

    @property
    def served_rounding(self) -> bool:
        """Whether codes are rounded as compressed-tensors/vLLM round them (the float32
        quotient; an FP4 zero is code 0): two-level schemes, tiles and the MX ``ct`` rule."""
        return self.tensor_scale or self.scale_rule == "ct" or self.granularity is Granularity.TILE

    @property
    def element_format(self) -> Format:
        """The format each value is stored in (for MX: the element format)."""
        if is_mx_name(self.format):
            return mx_format(self.format).element
        return _lookup(self.format)

    @property
    def element_bits(self) -> int:
        """Bits one stored element (code) costs."""
        return int(self.element_format.bits)

    @property
    def scale_bits(self) -> int:
        """Bits one stored scale costs (the scale format's width; for double quantization the
        8-bit code each block scale becomes)."""
        return _bits(_DQ_CODE_FORMAT if self.double_quant else self.scale_format)

    @property
    def zero_point_bits(self) -> int:
        """Bits one stored zero point costs: the element width when asymmetric, else 0."""
        return 0 if self.symmetric else self.element_bits

    @property
    def bits_per_value(self) -> float:
        """Bits per value for a tensor whose size divides the groups: element bits plus
        the scale (and zero point) overhead per group. Tensor and channel scales are
        amortised over sizes this scheme does not know, so they count as zero here
        (:meth:`tensor_bytes` and ``QuantizedTensor.bits_per_value`` have exact figures)."""
        bits = float(self.element_bits)
        if self.granularity in (Granularity.GROUP, Granularity.BLOCK, Granularity.TILE):
            g = float(self.group_size or 1)
            if self.block_shape is not None:
                g = float(self.block_shape[0] * self.block_shape[1])
            scale = float(self.scale_bits)
            if self.double_quant:
                scale += _bits(_DQ_STATE_FORMAT) / DQ_BLOCK
            bits += (scale + self.zero_point_bits) / g
        return bits

    def n_scales(self, shape: Sequence[int]) -> int:
        """How many scales ``lowbit.quantize`` stores for a tensor of this shape.

        Tensor: one. Channel: one per index along ``axis``. Group/block: ``ceil(L / G)`` per
        line along ``axis`` (the last group padded, as ``quantize`` does). An empty tensor: 0.

        Raises:
            LowbitError: ``axis`` out of range for the shape.
        """
        shape = tuple(int(s) for s in shape)
        n = math.prod(shape)
        if n == 0:
            return 0
        if self.granularity is Granularity.TENSOR:
            return 1
        if self.granularity is Granularity.TILE:
            rows, cols = tile_grid(shape, self.block_shape)  # type: ignore[arg-type]
            return rows * cols
        axis = int(self.axis)  # type: ignore[arg-type]
        if not shape or not -len(shape) <= axis < len(shape):
            raise LowbitError(f"axis {axis} is out of range for a tensor of shape {shape}")
        along = shape[axis]
        if self.granularity is Granularity.CHANNEL:
            return along
        return (n // along) * -(-along // int(self.group_size))  # type: ignore[arg-type]

    def tensor_bytes(self, shape: Sequence[int]) -> int:
        """Bytes ``lowbit.quantize`` stores for a tensor of this shape: packed codes, scales,
        zero points and double-quantization state (equals ``QuantizedTensor.nbytes``).

        Raises:
            LowbitError: ``axis`` out of range for the shape.
        """
        n = math.prod(int(s) for s in shape)
        s = self.n_scales(shape)
        scale_bits = s * self.scale_bits
        if self.tensor_scale and s:
            scale_bits += 32  # the float32 tensor scale
        if self.double_quant:
            scale_bits += (-(-s // DQ_BLOCK) + 1) * _bits(_DQ_STATE_FORMAT)
        return (
            -(-n * self.element_bits // 8) + -(-scale_bits // 8) + -(-s * self.zero_point_bits // 8)
        )

    @property
    def label(self) -> str:
        """The scheme's one short text form, e.g. ``int4:g128:fp16:asym``, ``int8:ch:fp32``,
        ``nf4:g64:fp32:dq``, ``mxfp4``; :func:`lowbit.quant.scheme_text.parse_scheme` reads it
        back to an equal scheme unless percentile, k_std, rounding or pad differ from their
        defaults (``to_dict`` says everything).

        Grammar: ``FORMAT[:gN|:ch|:t][:axA][:SCALEFMT][:asym][:dq][:restricted][:METHOD]``
        (llama.cpp's rounding, ``scale_method="ggml"``, is labelled ``q4_0``/``q5_0``/``q8_0``);
        the axis appears when not the default (0 per channel, -1 for groups), the scale
        format always (MX: E8M0, implied), the scale method when not the format's default.
        """
        if self.scale_method is ScaleMethod.GGML:
            return GGML_NAMES[self.format]
        if self == _NVFP4:
            return "nvfp4"
        parts = [self.format if self.is_mx else short_name(self.format)]
        if self.granularity is Granularity.GROUP:
            parts.append(f"g{self.group_size}")
        elif self.granularity is Granularity.CHANNEL:
            parts.append("ch")
        elif self.granularity is Granularity.TENSOR:
            parts.append("t")
        elif self.block_shape is not None:
            parts.append(f"b{self.block_shape[0]}x{self.block_shape[1]}")
        default_axis = 0 if self.granularity is Granularity.CHANNEL else -1
        no_axis = (Granularity.TENSOR, Granularity.TILE)
        if self.granularity not in no_axis and self.axis != default_axis:
            parts.append(f"ax{self.axis}")
        if not self.is_mx:
            parts.append(short_name(self.scale_format))
        if not self.symmetric:
            parts.append("asym")
        if self.double_quant:
            parts.append("dq")
        if self.restricted_range:
            parts.append("restricted")
        if self.tensor_scale:
            parts.append("ts")
        if self.scale_rule not in (None, "floor"):
            parts.append(str(self.scale_rule))
        if self.scale_method is not _default_method(self.format):
            parts.append(self.scale_method.value)
        return ":".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict with every field and ``"version"``."""
        d = asdict(self)
        d["granularity"] = self.granularity.value
        d["scale_method"] = self.scale_method.value
        # fields added after version 1 appear only when set, so older files stay as they were
        if not self.tensor_scale:
            d.pop("tensor_scale")
        if self.scale_rule in (None, "floor"):
            d.pop("scale_rule")
        if self.block_shape is None:
            d.pop("block_shape")
        else:
            d["block_shape"] = list(self.block_shape)
        d["version"] = SCHEME_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scheme:
        """Inverse of :meth:`to_dict`.

        Raises:
            LowbitError: unknown version or unknown keys.
        """
        if not isinstance(d, dict):
            raise LowbitError(f"a scheme must be a dict, got {type(d).__name__}")
        d = dict(d)
        version = d.pop("version", SCHEME_VERSION)
        if version != SCHEME_VERSION:
            raise LowbitError(
                f"scheme version {version!r} is not supported (this lowbit reads {SCHEME_VERSION})"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise LowbitError(f"unknown scheme keys {unknown}; known: {sorted(known)}")
        if "format" not in d:
            raise LowbitError("a scheme needs 'format'")
        return cls(**d)

    def describe(self) -> str:
        """The scheme's label (:attr:`label`), e.g. ``int4:g128:fp16`` or ``mxfp4``."""
        return self.label


def _default_method(name: str) -> ScaleMethod:
    return ScaleMethod.MEANABS if name in ("binary", "ternary") else ScaleMethod.ABSMAX


#: NVIDIA NVFP4 (the ``nvfp4`` label): E2M1 in groups of 16 along the rows, E4M3 group scales
#: under a float32 tensor scale (compressed-tensors' ``nvfp4-pack-quantized``).
_NVFP4 = Scheme(
    format="float4_e2m1fn", group_size=16, scale_format="float8_e4m3fn", tensor_scale=True
)


@dataclass(frozen=True)
class Cast:
    """Store a tensor in a plain float type with no scale (``bf16``, ``fp16``, ``fp32``).

    Not a :class:`Scheme` (nothing is scaled), but it answers the same storage questions, so
    the planner and precision plans price both alike.

    Args:
        dtype: ``float32`` | ``float16`` | ``bfloat16`` (aliases accepted).

    Raises:
        LowbitError: any other format.
    """

    dtype: str

    def __post_init__(self) -> None:
        name = _lookup(str(self.dtype)).name
        if name not in CAST_FORMATS:
            raise LowbitError(
                f"a plain cast stores float32, float16 or bfloat16, not {name}; "
                f"scale narrower formats (e.g. {short_name(name)}:ch)"
            )
        object.__setattr__(self, "dtype", name)

    @property
    def format(self) -> str:
        """The canonical format name (as :attr:`Scheme.format`)."""
        return self.dtype

    @property
    def element_format(self) -> Format:
        return _lookup(self.dtype)

    @property
    def element_bits(self) -> int:
        return _bits(self.dtype)

    @property
    def bits(self) -> int:
        return self.element_bits

    @property
    def bits_per_value(self) -> float:
        return float(self.element_bits)

    def n_scales(self, shape: Sequence[int]) -> int:
        return 0

    def tensor_bytes(self, shape: Sequence[int]) -> int:
        """Bytes of the cast tensor: ``numel * bits / 8``."""
        return -(-math.prod(int(s) for s in shape) * self.element_bits // 8)

    @property
    def label(self) -> str:
        """``bf16``, ``fp16`` or ``fp32`` (parses back to this cast)."""
        return short_name(self.dtype)

    def describe(self) -> str:
        return self.label

    def to_dict(self) -> dict[str, Any]:
        """``{"format": NAME, "cast": true}``."""
        return {"format": self.dtype, "cast": True}
