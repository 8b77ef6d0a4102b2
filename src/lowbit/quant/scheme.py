"""Quantization schemes: format, granularity, scale method; frozen, typed, JSON round-trip.

A :class:`Scheme` says everything ``lowbit.quantize`` needs to turn a tensor into codes
and scales; ``Scheme.to_dict`` / ``Scheme.from_dict`` round-trip it through JSON with a
``version``. Fields left out are derived sensibly: ``group_size`` implies per-group
scales, ``axis`` alone per-channel scales, an ``mx*`` format the OCP MX block layout
(32 values along the last axis), ``nf4`` QLoRA's blocks of 64, and ``binary`` /
``ternary`` the mean-absolute scale of BNN/TWN work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import TYPE_CHECKING, Any

from lowbit.errors import LowbitError
from lowbit.formats.enums import as_rounding

if TYPE_CHECKING:
    from lowbit.formats.base import Format
    from lowbit.quant.tensor import QuantizedTensor

SCHEME_VERSION = 1

#: Formats a scale may be stored in (canonical names).
SCALE_FORMATS = ("float32", "float16", "bfloat16", "float8_e8m0fnu")


class Granularity(str, Enum):
    """Which values share one scale.

    ``tensor``: the whole tensor. ``channel``: every index along ``axis``.
    ``group``: ``group_size`` consecutive values along ``axis``. ``block``: an OCP MX
    block of 32 values along ``axis`` with a power-of-two E8M0 scale.
    """

    TENSOR = "tensor"
    CHANNEL = "channel"
    GROUP = "group"
    BLOCK = "block"


class ScaleMethod(str, Enum):
    """How the clipping range (and so the scale) of each group is chosen.

    ``absmax``: the largest magnitude ("max quantization"; nothing clips).
    ``percentile``: the ``percentile``-th percentile of |x| (or of x, both tails, when
    asymmetric). ``meanstd``: |mean| + ``k_std`` standard deviations.
    ``mse``: the clipping ratio of absmax (searched on a grid, per group) that minimises
    the squared error. ``meanabs``: the mean of |x| (BNN/XNOR-Net for binary; TWN for
    ternary: threshold 0.7·mean|x|, scale = mean |x| above it).
    """

    ABSMAX = "absmax"
    PERCENTILE = "percentile"
    MSE = "mse"
    MEANSTD = "meanstd"
    MEANABS = "meanabs"


def _enum(cls: type[Enum], value: Any, what: str) -> Any:
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in cls)  # type: ignore[attr-defined]
        raise LowbitError(f"unknown {what} {value!r}; allowed: {allowed}") from None


def canonical_scale_format(name: str) -> str:
    """Canonical name of a scale format (aliases such as ``fp16``, ``bf16``, ``e8m0``)."""
    from lowbit.formats.catalog import format as lookup

    try:
        canon = lookup(name).name
    except LowbitError:
        canon = str(name)
    if canon not in SCALE_FORMATS:
        raise LowbitError(
            f"unsupported scale format {name!r}; allowed: float32, float16, bfloat16, e8m0"
        )
    return canon


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

    def __post_init__(self) -> None:
        from lowbit.formats.mx import is_mx_name, mx_format

        set_ = object.__setattr__
        if not isinstance(self.format, str):
            set_(self, "format", getattr(self.format, "name", str(self.format)))
        name = self.format.strip().lower()
        mx = is_mx_name(name)
        if mx:
            name = mx_format(name).name
        else:
            from lowbit.formats.catalog import format as lookup

            name = lookup(name).name
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
                set_(self, "group_size", 64)
            else:
                gran = Granularity.TENSOR
        gran = _enum(Granularity, gran, "granularity")
        set_(self, "granularity", gran)

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
        else:  # tensor
            if self.group_size is not None or self.axis is not None:
                raise LowbitError("tensor granularity takes neither axis nor group_size")

        method = self.scale_method
        if method is None:
            method = ScaleMethod.MEANABS if name in ("binary", "ternary") else ScaleMethod.ABSMAX
        method = _enum(ScaleMethod, method, "scale method")
        set_(self, "scale_method", method)
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

    # ---- derived -------------------------------------------------------------------

    @property
    def is_mx(self) -> bool:
        """Whether this is an OCP MX block format."""
        return self.granularity is Granularity.BLOCK

    @property
    def element_format(self) -> Format:
        """The format each value is stored in (for MX: the element format)."""
        from lowbit.formats.mx import is_mx_name, mx_format

        if is_mx_name(self.format):
            return mx_format(self.format).element
        from lowbit.formats.catalog import format as lookup

        return lookup(self.format)

    @property
    def scale_bits(self) -> int:
        """Bits one stored scale costs."""
        return {"float32": 32, "float16": 16, "bfloat16": 16, "float8_e8m0fnu": 8}[
            self.scale_format
        ]

    @property
    def bits_per_value(self) -> float:
        """Bits per value for a tensor whose size divides the groups: element bits plus
        the scale (and zero point) overhead per group. Tensor and channel scales are
        amortised over sizes this scheme does not know, so they count as zero here
        (``QuantizedTensor.bits_per_value`` has the exact figure)."""
        bits = float(self.element_format.bits)
        if self.granularity in (Granularity.GROUP, Granularity.BLOCK):
            g = float(self.group_size or 1)
            if self.double_quant:
                bits += 8.0 / g + 32.0 / (g * 256)
            else:
                bits += self.scale_bits / g
            if not self.symmetric:
                bits += self.element_format.bits / g
        return bits

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict with every field and ``"version"``."""
        d = asdict(self)
        d["granularity"] = self.granularity.value
        d["scale_method"] = self.scale_method.value
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

    def quantize(self, x: Any, *, seed: Any = None, nan: str = "raise") -> QuantizedTensor:
        """Quantize ``x`` with this scheme (see :func:`lowbit.quantize`)."""
        from lowbit.quant.tensor import quantize

        return quantize(x, self, seed=seed, nan=nan)

    def describe(self) -> str:
        """A short human label, e.g. ``int4 g128 fp16`` or ``mxfp4``."""
        parts = [self.format]
        if self.granularity is Granularity.GROUP:
            parts.append(f"g{self.group_size}")
        elif self.granularity is Granularity.CHANNEL:
            parts.append(f"per-channel(axis={self.axis})")
        if self.scale_method not in (ScaleMethod.ABSMAX, ScaleMethod.MEANABS):
            parts.append(self.scale_method.value)
        if not self.symmetric:
            parts.append("asym")
        if self.double_quant:
            parts.append("dq")
        if self.scale_format not in ("float32", "float8_e8m0fnu"):
            parts.append({"float16": "fp16", "bfloat16": "bf16"}[self.scale_format])
        return " ".join(parts)
