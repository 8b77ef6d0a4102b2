"""Weight schemes and rules for planning: how many bytes a tensor takes in a given format.

A :class:`WeightScheme` mirrors the fields of ``lowbit.Scheme`` that decide storage (format,
granularity, group_size, scale_format, symmetric, double_quant) and adds
``zero_point_bits``; :func:`parse_scheme` reads short strings
(``FORMAT[:gN|:ch|:t][:SCALE][:asym|:zpN][:dq]``), dicts such as ``Scheme.to_dict()``, or a
``Scheme`` object. :class:`Rule` lists say which tensors get which scheme (a mixed plan);
:func:`load_plan_file` reads them from JSON or YAML. Pure arithmetic: only the format
catalog's bit widths are used.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowbit.errors import LowbitError, UnknownFormatError
from lowbit.formats.catalog import format as _catalog_format
from lowbit.planning.hardware import read_data_file
from lowbit.planning.modelspec import COMPONENTS, TensorInfo

# ---------------------------------------------------------------------------------------
# Weight schemes
# ---------------------------------------------------------------------------------------

#: OCP MX v1.0 block formats: element format; blocks of 32 share an E8M0 scale.
MX_ELEMENTS = {
    "mxfp8_e4m3": "float8_e4m3fn",
    "mxfp8_e5m2": "float8_e5m2",
    "mxfp6_e3m2": "float6_e3m2fn",
    "mxfp6_e2m3": "float6_e2m3fn",
    "mxfp4": "float4_e2m1fn",
    "mxint8": "int8",
}
_MX_ALIASES = {"mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e3m2", "mxfp4_e2m1": "mxfp4",
               "mxfp8_e4m3fn": "mxfp8_e4m3"}  # fmt: skip
GRANULARITIES = ("none", "tensor", "channel", "group", "block")

#: Named schemes: llama.cpp's legacy block types (ggml-common.h) and NVIDIA NVFP4.
PRESETS: dict[str, dict[str, Any]] = {
    "nvfp4": {"format": "float4_e2m1fn", "group_size": 16, "scale_format": "float8_e4m3fn"},
    "q8_0": {"format": "int8", "group_size": 32, "scale_format": "float16"},
    "q4_0": {"format": "int4", "group_size": 32, "scale_format": "float16"},
    "q4_1": {"format": "int4", "group_size": 32, "scale_format": "float16",
             "symmetric": False, "zero_point_bits": 16},
    "q5_0": {"format": "int5", "group_size": 32, "scale_format": "float16"},
    "q5_1": {"format": "int5", "group_size": 32, "scale_format": "float16",
             "symmetric": False, "zero_point_bits": 16},
}  # fmt: skip

_SHORT = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
          "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "float6_e3m2fn": "fp6_e3m2",
          "float6_e2m3fn": "fp6_e2m3", "float4_e2m1fn": "fp4", "float8_e8m0fnu": "e8m0",
          "tensorfloat32": "tf32"}  # fmt: skip
# Scheme.to_dict() keys the planner reads or may safely ignore.
_SCHEME_KEYS = {"format", "granularity", "axis", "group_size", "symmetric", "scale_format",
                "double_quant", "zero_point_bits", "name"}  # fmt: skip
_IGNORED_KEYS = {"scale_method", "percentile", "k_std", "restricted_range", "rounding", "pad",
                 "version"}  # fmt: skip
DQ_BLOCK = 256  # QLoRA double quantization: 8-bit scales, one FP32 constant per 256 of them


def storage_bits(name: str) -> int:
    """Bits one value of a catalog format occupies when stored (TF32: its 32-bit container)."""
    fmt = _catalog_format(name)
    return int(getattr(fmt, "container", None) or fmt.bits)


@dataclass(frozen=True, kw_only=True)
class WeightScheme:
    """How one tensor is stored: element format plus scales (mirrors ``lowbit.Scheme``).

    Attributes:
        format: catalog name or alias, or an MX block format (``mxfp4``, ``mxfp8_e4m3``, ...).
        granularity: ``none`` (a plain cast, no scale), ``tensor``, ``channel`` (one scale per
            index along ``axis``, default 0: per output row), ``group`` (``group_size``
            consecutive values along ``axis``, default -1), ``block`` (OCP MX: 32 values,
            E8M0 scale).
        axis: as ``lowbit.Scheme``: the channel axis, or the axis groups run along.
        group_size: values per scale for ``group``/``block``.
        scale_format: catalog name of the scales (default FP32, as ``lowbit.Scheme``).
        symmetric: False adds one zero point per scale.
        zero_point_bits: width of a zero point (default: the element's own width, an integer
            zero point as GPTQ/AWQ store it; 16 for llama.cpp's FP16 minimum).
        double_quant: QLoRA double quantization of the scales (8-bit, FP32 per 256).
        name: display name (set for presets such as ``nvfp4``).
    """

    format: str
    granularity: str = "none"
    axis: int | None = None
    group_size: int | None = None
    scale_format: str | None = None
    symmetric: bool = True
    zero_point_bits: int | None = None
    double_quant: bool = False
    name: str | None = None

    def __post_init__(self) -> None:
        fmt = self.format.strip().lower()
        fmt = _MX_ALIASES.get(fmt, fmt)
        if fmt in MX_ELEMENTS:
            if self.granularity not in ("none", "block") or self.group_size not in (None, 32):
                raise LowbitError(f"{fmt} is an MX block format: 32 values per E8M0 scale")
            object.__setattr__(self, "format", fmt)
            object.__setattr__(self, "granularity", "block")
            object.__setattr__(self, "group_size", 32)
            object.__setattr__(self, "scale_format", "float8_e8m0fnu")
        else:
            object.__setattr__(self, "format", _catalog_format(fmt).name)
        if self.granularity not in GRANULARITIES:
            raise LowbitError(
                f"unknown granularity {self.granularity!r}; choose one of {', '.join(GRANULARITIES)}"
            )
        if self.granularity in ("group", "block"):
            if not isinstance(self.group_size, int) or self.group_size < 1:
                raise LowbitError(
                    f"group granularity needs a positive group_size, got {self.group_size!r}"
                )
        elif self.group_size is not None:
            raise LowbitError(f"group_size={self.group_size} needs granularity 'group'")
        if self.granularity == "none":
            if self.scale_format or not self.symmetric or self.double_quant:
                raise LowbitError("a scale, zero point or double quantization needs a granularity")
        else:
            object.__setattr__(
                self, "scale_format", _catalog_format(self.scale_format or "float32").name
            )
        if self.axis is not None and (
            isinstance(self.axis, bool) or not isinstance(self.axis, int)
        ):
            raise LowbitError(f"axis must be an integer, got {self.axis!r}")
        if self.zero_point_bits is not None and (
            isinstance(self.zero_point_bits, bool) or not 1 <= int(self.zero_point_bits) <= 64
        ):
            raise LowbitError(f"zero_point_bits must be 1..64, got {self.zero_point_bits!r}")

    # -- derived ------------------------------------------------------------------------

    @property
    def element_format(self) -> str:
        """Canonical catalog name of the element format."""
        return MX_ELEMENTS.get(self.format, self.format)

    @property
    def element_bits(self) -> int:
        return storage_bits(self.element_format)

    @property
    def scale_bits(self) -> int:
        return storage_bits(self.scale_format) if self.scale_format else 0

    @property
    def zp_bits(self) -> int:
        if self.symmetric:
            return 0
        return int(self.zero_point_bits or self.element_bits)

    @property
    def label(self) -> str:
        """Short text form (parses back with :func:`parse_scheme`)."""
        if self.name:
            return self.name
        if self.granularity == "block":
            return self.format + (":dq" if self.double_quant else "")
        parts = [_SHORT.get(self.format, self.format)]
        if self.granularity == "group":
            parts.append(f"g{self.group_size}")
        elif self.granularity in ("channel", "tensor"):
            parts.append("ch" if self.granularity == "channel" else "t")
        default_axis = 0 if self.granularity == "channel" else -1
        if self.axis is not None and self.axis != default_axis:
            parts.append(f"ax{self.axis}")
        if self.scale_format:
            parts.append(_SHORT.get(self.scale_format, self.scale_format))
        if not self.symmetric:
            parts.append("asym" if self.zero_point_bits is None else f"zp{self.zero_point_bits}")
        if self.double_quant:
            parts.append("dq")
        return ":".join(parts)

    @property
    def is_plain(self) -> bool:
        return self.granularity == "none"

    def n_scales(self, shape: Sequence[int]) -> int:
        """How many scales a tensor of this shape carries.

        Channel: one per index along ``axis`` (default 0; a 1-D tensor gets one).
        Group/block: ``ceil(len / G)`` per line along ``axis`` (default -1), the last group
        padded, as ``lowbit.quantize`` does.
        """
        n = math.prod(shape)
        if self.granularity == "none" or n == 0:
            return 0
        if self.granularity == "tensor" or not shape:
            return 1
        if self.granularity == "channel":
            if len(shape) < 2 and self.axis is None:
                return 1
            return shape[self._axis(shape, 0)]
        along = shape[self._axis(shape, -1)]
        return (n // along) * -(-along // self.group_size)  # type: ignore[operator]

    def _axis(self, shape: Sequence[int], default: int) -> int:
        axis = default if self.axis is None else self.axis
        if not -len(shape) <= axis < len(shape):
            raise LowbitError(f"axis {axis} is out of range for a tensor of shape {tuple(shape)}")
        return axis

    def tensor_bytes(self, shape: Sequence[int]) -> int:
        """Stored bytes of one tensor: codes, scales and zero points, each packed to bytes."""
        n = math.prod(shape)
        s = self.n_scales(shape)
        if self.double_quant:
            scale_bits = s * 8 + -(-s // DQ_BLOCK) * 32 + 32  # + the per-tensor mean offset
        else:
            scale_bits = s * self.scale_bits
        return -(-n * self.element_bits // 8) + -(-scale_bits // 8) + -(-s * self.zp_bits // 8)

    @property
    def nominal_bits_per_weight(self) -> float:
        """Bits per weight for a large tensor whose rows divide into whole groups."""
        if self.granularity in ("none", "tensor", "channel"):
            return float(self.element_bits)
        g = self.group_size or 1
        scale = 8 + 32 / DQ_BLOCK if self.double_quant else self.scale_bits
        return self.element_bits + (scale + self.zp_bits) / g

    def to_dict(self) -> dict[str, Any]:
        """The fields of ``lowbit.Scheme`` this planner uses, plus ``zero_point_bits``."""
        return {
            "format": self.format,
            "granularity": self.granularity,
            "axis": self.axis,
            "group_size": self.group_size,
            "scale_format": self.scale_format,
            "symmetric": self.symmetric,
            "zero_point_bits": self.zp_bits or None,
            "double_quant": self.double_quant,
            "label": self.label,
        }


def parse_scheme(spec: Any) -> WeightScheme:
    """A :class:`WeightScheme` from a string, a dict (``Scheme.to_dict()``) or a ``Scheme``.

    String form: ``FORMAT[:gN|:ch|:t][:SCALE][:asym|:zpN][:dq]``, for example ``bf16``,
    ``int4:g128:fp16`` (4.125 bits/weight), ``int4:g128:fp16:asym``, ``nf4:g64`` (FP32
    absmax, 4.5), ``nf4:g64:dq`` (about 4.127), ``int8:ch:fp16``; MX formats ``mxfp4``,
    ``mxfp6``, ``mxfp8``, ``mxint8``; presets ``nvfp4``, ``q8_0``, ``q4_0``, ``q4_1``,
    ``q5_0``, ``q5_1``. A scale with no granularity means one scale per tensor; a
    granularity with no scale uses FP32 scales (``lowbit.Scheme``'s default).

    Raises:
        LowbitError: an unknown format, token or field (the message lists what is allowed).
    """
    if isinstance(spec, WeightScheme):
        return spec
    if isinstance(spec, str):
        return _parse_string(spec)
    if isinstance(spec, Mapping):
        return _from_mapping(spec)
    to_dict = getattr(spec, "to_dict", None)
    if callable(to_dict) and hasattr(spec, "format"):
        return _from_mapping(to_dict())
    raise LowbitError(f"cannot read {spec!r} as a weight scheme: give a string, dict or Scheme")


def _parse_string(text: str) -> WeightScheme:
    parts = [p.strip() for p in text.strip().lower().split(":")]
    head = parts[0]
    if not head:
        raise LowbitError(f"empty scheme {text!r}")
    if head in PRESETS and len(parts) == 1:
        return WeightScheme(**PRESETS[head], granularity="group", name=head)
    kw: dict[str, Any] = {"format": head}
    for tok in parts[1:]:
        if tok.startswith("g") and tok[1:].isdigit():
            kw["granularity"], kw["group_size"] = "group", int(tok[1:])
        elif tok in ("ch", "channel"):
            kw["granularity"] = "channel"
        elif tok in ("t", "tensor"):
            kw["granularity"] = "tensor"
        elif tok.startswith("ax") and tok[2:].lstrip("-").isdigit():
            kw["axis"] = int(tok[2:])
        elif tok == "asym":
            kw["symmetric"] = False
        elif tok.startswith("zp") and tok[2:].isdigit():
            kw["symmetric"], kw["zero_point_bits"] = False, int(tok[2:])
        elif tok == "dq":
            kw["double_quant"] = True
        else:
            try:
                kw["scale_format"] = _catalog_format(tok).name
            except UnknownFormatError:
                raise LowbitError(
                    f"unknown token {tok!r} in scheme {text!r}; tokens: gN (group of N), ch "
                    "(per channel), t (per tensor), a scale format (fp16, fp32, bf16, e8m0, "
                    "e4m3), asym, zpN (zero point of N bits), dq (double quantization)"
                ) from None
    if kw.get("granularity") is None and kw.get("double_quant"):
        # double quantization quantizes many block scales: QLoRA's blocks of 64 for NF4
        if head != "nf4":
            raise LowbitError(
                f"scheme {text!r}: dq (double quantization of the scales) needs groups: add gN"
            )
        kw["granularity"], kw["group_size"] = "group", 64
    if kw.get("granularity") is None and (kw.get("scale_format") or kw.get("symmetric") is False):
        kw["granularity"] = "tensor"
    try:
        return WeightScheme(**kw)
    except UnknownFormatError as exc:
        raise LowbitError(
            f"{exc}; MX formats: {', '.join(MX_ELEMENTS)}; presets: {', '.join(PRESETS)}"
        ) from None


def _from_mapping(d: Mapping[str, Any]) -> WeightScheme:
    unknown = set(d) - _SCHEME_KEYS - _IGNORED_KEYS - {"label"}
    if unknown:
        raise LowbitError(
            f"unknown scheme field(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(_SCHEME_KEYS))}"
        )
    if "format" not in d:
        raise LowbitError(f"a scheme needs a format, got {dict(d)!r}")
    kw = {k: d[k] for k in _SCHEME_KEYS if k in d and d[k] is not None}
    gran = kw.get("granularity")
    if hasattr(gran, "value"):
        gran = gran.value
    fmt = str(kw["format"]).lower()
    if gran is None:  # derived as lowbit.Scheme does
        if _MX_ALIASES.get(fmt, fmt) in MX_ELEMENTS:
            gran = "block"
        elif kw.get("group_size"):
            gran = "group"
        elif d.get("axis") is not None:
            gran = "channel"
        elif fmt == "nf4":  # QLoRA blocks of 64, as lowbit.Scheme derives it
            gran = "group"
            kw.setdefault("group_size", 64)
        else:
            gran = "tensor"
    kw["granularity"] = str(gran).lower()
    if kw["granularity"] in ("tensor", "channel"):
        kw.pop("group_size", None)
    if kw["granularity"] in ("tensor", "none"):
        kw.pop("axis", None)
    if kw["granularity"] == "none":
        kw.pop("scale_format", None)
    return WeightScheme(**kw)


# ---------------------------------------------------------------------------------------
# Rules: which tensors get which scheme (a mixed plan)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """Tensors matching every given condition get ``scheme``; the first matching rule wins.

    Attributes:
        scheme: the scheme for matching tensors.
        match: glob(s) on tensor names (``fnmatch``; ``*embed*``, ``model.layers.*.mlp.*``).
        component: component name(s): embeddings, attention, mlp, norms, lm_head, other.
        ndim: tensor rank (1 selects norms and biases).
    """

    scheme: WeightScheme
    match: tuple[str, ...] = ()
    component: tuple[str, ...] = ()
    ndim: int | None = None

    def matches(self, t: TensorInfo) -> bool:
        if self.match and not any(fnmatch.fnmatchcase(t.name, g) for g in self.match):
            return False
        if self.component and t.component not in self.component:
            return False
        return self.ndim is None or len(t.shape) == self.ndim

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.scheme.label}
        if self.match:
            out["match"] = list(self.match)
        if self.component:
            out["component"] = list(self.component)
        if self.ndim is not None:
            out["ndim"] = self.ndim
        return out


def _as_tuple(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(str(x) for x in v)


def parse_rule(d: Any) -> Rule:
    """A :class:`Rule` from ``{"match"|"component"|"ndim": ..., "format"|"scheme": ...}``."""
    if isinstance(d, Rule):
        return d
    if not isinstance(d, Mapping):
        raise LowbitError(f"a rule must be an object, got {d!r}")
    unknown = set(d) - {"match", "component", "ndim", "format", "scheme"}
    if unknown:
        raise LowbitError(
            f"unknown rule field(s) {', '.join(sorted(unknown))}; "
            "allowed: match, component, ndim, format (or scheme)"
        )
    spec = d.get("format", d.get("scheme"))
    if spec is None:
        raise LowbitError(f"rule {dict(d)!r} needs a format")
    comps = _as_tuple(d.get("component"))
    bad = [c for c in comps if c not in COMPONENTS]
    if bad:
        raise LowbitError(f"unknown component(s) {bad}; choose from {', '.join(COMPONENTS)}")
    if not (d.get("match") or comps or d.get("ndim") is not None):
        raise LowbitError(f"rule {dict(d)!r} needs match, component or ndim")
    ndim = d.get("ndim")
    if ndim is not None and (isinstance(ndim, bool) or not isinstance(ndim, int)):
        raise LowbitError(f"rule ndim must be an integer, got {ndim!r}")
    return Rule(parse_scheme(spec), _as_tuple(d.get("match")), comps, ndim)


def load_plan_file(path: str | Path) -> tuple[list[Rule], WeightScheme | None]:
    """Read a plan file: ``{"version": 1, "default": SCHEME, "rules": [RULE, ...]}`` or a list.

    JSON, or YAML when the name ends in ``.yaml``/``.yml`` and PyYAML is installed.

    Returns:
        The ordered rules and the default scheme (None when the file has none).
    """
    data = read_data_file(path)
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, Mapping):
        raise LowbitError(f"{path}: a plan file holds an object with 'rules' (and 'default')")
    unknown = set(data) - {"version", "default", "rules"}
    if unknown:
        raise LowbitError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    if data.get("version", 1) != 1:
        raise LowbitError(f"{path}: plan file version {data.get('version')!r}; this reads 1")
    rules = data.get("rules") or []
    if not isinstance(rules, list):
        raise LowbitError(f"{path}: 'rules' must be a list")
    default = data.get("default")
    return [parse_rule(r) for r in rules], (parse_scheme(default) if default else None)
