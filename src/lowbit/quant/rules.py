"""Scheme strings and plan rules for quantizing checkpoints (used by ``lowbit.quant.plan``).

:func:`scheme_from_spec` turns the planner's scheme strings (``lowbit.planning.schemes.parse_scheme``:
``FORMAT[:gN|:ch|:t][:SCALE][:asym][:dq]``, MX names, presets) into the ``lowbit.Scheme`` a weight
is quantized with, giving a format without granularity the usual weight layout (per output
channel; NF4 in blocks of 64); ``keep`` and plain casts (``bf16``) are the other actions.
:class:`PlanRule` is one ordered rule: globs, full-match regexes, components and rank select
tensors; :func:`parse_plan_rule` reads the planner's rule dicts plus ``regex``,
``scale_method``, ``activations`` and ``pad``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lowbit.errors import LowbitError
from lowbit.planning.modelspec import COMPONENTS, classify
from lowbit.quant.scheme import Granularity, ScaleMethod, Scheme

__all__ = [
    "CAST_FORMATS",
    "KEEP",
    "Action",
    "Cast",
    "PlanRule",
    "action_dict",
    "activation_format",
    "parse_plan_rule",
    "scheme_from_spec",
    "scheme_label",
]

KEEP = "keep"

#: Formats a plain cast may store (safetensors dtype names for the lowbit checkpoint).
CAST_FORMATS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_RULE_KEYS = {"match", "regex", "component", "ndim", "format", "scheme", "scale_method",
              "activations", "pad"}  # fmt: skip

# ---------------------------------------------------------------------------------------
# Schemes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cast:
    """Store a tensor in a plain float type, no scale (``bf16``, ``fp16``, ``fp32``)."""

    dtype: str  # float32 | float16 | bfloat16

    @property
    def bits(self) -> int:
        return 32 if self.dtype == "float32" else 16

    def describe(self) -> str:
        return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[self.dtype]


Action = Scheme | Cast | None  # None: keep as stored


def scheme_label(scheme: Scheme | Cast | None) -> str:
    """A short text form: ``int4:g128:fp32``, ``int8:ch:fp32:asym``, ``mxfp4``, ``bf16``, ``keep``.

    The scale method is appended in parentheses when it is not absmax (``int4:g128:fp32 (mse)``).
    """
    if scheme is None:
        return KEEP
    if isinstance(scheme, Cast):
        return scheme.describe()
    from lowbit.planning.schemes import WeightScheme

    ws = WeightScheme(
        format=scheme.format,
        granularity=scheme.granularity.value,
        axis=None if scheme.granularity is Granularity.TENSOR else scheme.axis,
        group_size=scheme.group_size
        if scheme.granularity in (Granularity.GROUP, Granularity.BLOCK)
        else None,
        scale_format=scheme.scale_format,
        symmetric=scheme.symmetric,
        double_quant=scheme.double_quant,
    )
    label = ws.label
    if scheme.scale_method not in (ScaleMethod.ABSMAX, ScaleMethod.MEANABS):
        label += f" ({scheme.scale_method.value})"
    return label


def scheme_from_spec(
    spec: Any,
    *,
    group: int | None = None,
    scale_method: str | None = None,
    asym: bool | None = None,
    scale_format: str | None = None,
    pad: bool = True,
) -> Scheme | Cast | None:
    """The scheme a weight gets from a scheme string, dict or object, with CLI-style overrides.

    Strings are parsed by :func:`lowbit.planning.schemes.parse_scheme` (``int4:g128:fp16``,
    ``nf4:dq``, ``mxfp4``, ``q4_0``, ``bf16`` ...), ``"keep"`` means keep as stored. A format
    with no granularity gets the weight layout: per output channel for integers and floats,
    QLoRA's blocks of 64 for NF4 (MX formats are blocks of 32 anyway); ``fp32``/``fp16``/
    ``bf16`` alone are plain casts. A dict with ``"version"`` is ``Scheme.to_dict()``'s.

    Args:
        spec: the scheme (string, dict, :class:`~lowbit.quant.scheme.Scheme` or :class:`Cast`).
        group: values per scale along the rows (``--group N``): group granularity.
        scale_method: ``absmax`` | ``percentile`` | ``meanstd`` | ``mse``.
        asym: integer formats get a zero point (``--asym``).
        scale_format: the scales' format (``fp32``, ``fp16``, ``bf16``, ``e8m0``).
        pad: let the last group of a row be shorter (False: a row the group does not divide is
            an error).

    Returns:
        A :class:`~lowbit.quant.scheme.Scheme`, a :class:`Cast`, or None for keep.

    Raises:
        LowbitError: an unknown format or token, or a combination lowbit cannot quantize to
            (the message names the scheme).
    """
    if isinstance(spec, (Scheme, Cast)) or spec is None:
        if any(v is not None for v in (group, scale_method, asym, scale_format)):
            raise LowbitError("options such as --group apply to scheme strings, not Scheme objects")
        return spec
    if isinstance(spec, str) and spec.strip().lower() == KEEP:
        if any(v is not None for v in (group, scale_method, asym, scale_format)):
            raise LowbitError("'keep' takes no --group, --scale-method, --asym or --scale-format")
        return None
    if isinstance(spec, Mapping) and "version" in spec:
        return Scheme.from_dict(dict(spec))
    from lowbit.planning.schemes import parse_scheme

    text = spec if isinstance(spec, str) else None
    try:
        ws = parse_scheme(spec)
        overrides: dict[str, Any] = {}
        if group is not None:
            if ws.granularity == "block":
                raise LowbitError(f"{ws.format} is an MX block format: its group is 32")
            overrides.update(granularity="group", group_size=int(group), axis=None)
        if asym:
            overrides["symmetric"] = False
        if scale_format is not None:
            overrides["scale_format"] = scale_format
        if overrides:
            if ws.granularity == "none" and "granularity" not in overrides:
                overrides["granularity"] = _weight_granularity(ws.format)
                if overrides["granularity"] == "group":
                    overrides["group_size"] = 64
            ws = dataclasses.replace(ws, name=None, **overrides)
    except LowbitError as exc:
        raise LowbitError(f"scheme {_show(spec)}: {exc}") from None
    if ws.zero_point_bits is not None and ws.zero_point_bits != ws.element_bits:
        raise LowbitError(
            f"scheme {_show(spec)}: lowbit stores zero points at the element width; "
            f"{ws.zero_point_bits}-bit zero points (llama.cpp's Q4_1/Q5_1 minimum) are a "
            f"planning figure only: use an :asym scheme"
        )
    gran = ws.granularity
    size = ws.group_size
    if gran == "none":
        if ws.format in CAST_FORMATS:
            if scale_method is not None:
                raise LowbitError(f"scheme {_show(spec)} is a plain cast: it has no scale method")
            return Cast(ws.format)
        gran = _weight_granularity(ws.format)
        size = 64 if gran == "group" else None
    elif (
        ws.format == "nf4"
        and gran == "tensor"
        and ws.double_quant
        and text is not None
        and not re.search(r":(t|tensor)(:|$)", text.lower())
    ):
        gran, size = "group", 64  # "nf4:dq": QLoRA's blocks of 64 with double quantization
    kw: dict[str, Any] = {
        "format": ws.format,
        "scale_method": scale_method,
        "symmetric": ws.symmetric,
        "double_quant": ws.double_quant,
        "pad": pad,
    }
    if gran != "block":
        kw.update(granularity=gran, group_size=size, scale_format=ws.scale_format or "float32")
        if gran != "tensor":
            kw["axis"] = ws.axis
    try:
        return Scheme(**kw)
    except LowbitError as exc:
        raise LowbitError(f"scheme {_show(spec)}: {exc}") from None


def _weight_granularity(fmt: str) -> str:
    return "group" if fmt == "nf4" else "channel"


def _show(spec: Any) -> str:
    return (
        repr(spec)
        if isinstance(spec, str)
        else repr(dict(spec) if isinstance(spec, Mapping) else spec)
    )


def activation_format(name: str | None) -> str | None:
    """Canonical name of an activation format for W8A8 simulation (``int8``, ``fp8`` = E4M3).

    Raises:
        LowbitError: a format the per-token simulation cannot take (value sets, unsigned).
    """
    if name is None:
        return None
    from lowbit.formats.catalog import format as lookup

    key = str(name).strip().lower()
    fmt = lookup({"fp8": "float8_e4m3fn"}.get(key, key))
    ok = (fmt.kind == "int" and getattr(fmt, "signed", False) and fmt.bits <= 16) or (
        fmt.kind == "float" and getattr(fmt, "signed", True) and getattr(fmt, "subnormals", True)
    )
    if not ok:
        raise LowbitError(
            f"activations {name!r}: per-token simulation takes signed integers (int8) or signed "
            f"floats with subnormals (fp8_e4m3, fp8_e5m2), not {fmt.name}"
        )
    return fmt.name


# ---------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRule:
    """Tensors matching every given condition get ``action``; the first matching rule wins.

    Attributes:
        action: a :class:`~lowbit.quant.scheme.Scheme`, a :class:`Cast`, or None (keep as stored).
        match: glob(s) on tensor names (``fnmatch``, case-sensitive).
        regex: regular expression(s), each matched against the whole name.
        component: component name(s) (``lowbit.planning.modelspec.COMPONENTS``).
        ndim: tensor rank.
        activations: per-token activation format for the layers this rule quantizes.
    """

    action: Action
    match: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    component: tuple[str, ...] = ()
    ndim: int | None = None
    activations: str | None = None

    def __post_init__(self) -> None:
        if not (self.match or self.regex or self.component or self.ndim is not None):
            raise LowbitError("a plan rule needs match, regex, component or ndim")
        for r in self.regex:
            try:
                re.compile(r)
            except re.error as exc:
                raise LowbitError(f"plan rule regex {r!r} does not compile: {exc}") from None
        bad = [c for c in self.component if c not in COMPONENTS]
        if bad:
            raise LowbitError(f"unknown component(s) {bad}; choose from {', '.join(COMPONENTS)}")

    def matches(self, name: str, shape: Sequence[int], alias: str | None = None) -> bool:
        """Whether a tensor of this name (or alias: a GGUF tensor's transformers name) and
        shape falls under the rule."""
        names = (name,) if alias is None else (name, alias)
        if self.match and not any(fnmatch.fnmatchcase(n, g) for n in names for g in self.match):
            return False
        if self.regex and not any(re.fullmatch(r, n) for n in names for r in self.regex):
            return False
        if self.component and classify(name, len(shape)) not in self.component:
            return False
        return self.ndim is None or len(shape) == self.ndim

    def describe(self) -> str:
        """``match '*mlp*' -> int4:g128:fp32`` (for messages)."""
        parts = []
        if self.match:
            parts.append("match " + ", ".join(repr(g) for g in self.match))
        if self.regex:
            parts.append("regex " + ", ".join(repr(r) for r in self.regex))
        if self.component:
            parts.append("component " + ", ".join(self.component))
        if self.ndim is not None:
            parts.append(f"ndim {self.ndim}")
        return f"{' '.join(parts)} -> {scheme_label(self.action)}"

    def to_dict(self) -> dict[str, Any]:
        """The rule in plan-file form (parses back with :func:`parse_plan_rule`)."""
        out: dict[str, Any] = {}
        if self.match:
            out["match"] = list(self.match)
        if self.regex:
            out["regex"] = list(self.regex)
        if self.component:
            out["component"] = list(self.component)
        if self.ndim is not None:
            out["ndim"] = self.ndim
        out.update(action_dict(self.action))
        if self.activations:
            out["activations"] = self.activations
        return out


def action_dict(action: Action) -> dict[str, Any]:
    """The plan-file form of an action: ``{"format": ...}`` (plus ``scale_method``/``pad``)
    that parses back to exactly ``action``; a Scheme the short form cannot say in full
    (rounding, percentile, axis ...) as its ``to_dict()``."""
    if action is None:
        return {"format": KEEP}
    if isinstance(action, Cast):
        return {"format": action.describe()}
    out: dict[str, Any] = {"format": scheme_label(action).split(" ")[0]}
    method = action.scale_method.value
    if action.scale_method not in (ScaleMethod.ABSMAX, ScaleMethod.MEANABS):
        out["scale_method"] = method
    if not action.pad:
        out["pad"] = False
    try:
        again = scheme_from_spec(
            out["format"], scale_method=out.get("scale_method"), pad=action.pad
        )
    except LowbitError:
        again = None
    if again != action:  # options the short form cannot say (rounding, percentile, axis...)
        return {"format": action.to_dict()}
    return out


def parse_plan_rule(d: Any) -> PlanRule:
    """A :class:`PlanRule` from a plan-file entry (see the module docstring for the fields).

    Raises:
        LowbitError: unknown fields, a missing format, a bad scheme, glob, regex or component.
    """
    if isinstance(d, PlanRule):
        return d
    if not isinstance(d, Mapping):
        raise LowbitError(f"a plan rule must be an object, got {d!r}")
    unknown = set(d) - _RULE_KEYS
    if unknown:
        raise LowbitError(
            f"unknown rule field(s) {', '.join(sorted(unknown))}; allowed: "
            f"{', '.join(sorted(_RULE_KEYS))}"
        )
    spec = d.get("format", d.get("scheme"))
    if spec is None:
        raise LowbitError(f"plan rule {dict(d)!r} needs a format (a scheme, or 'keep')")
    globs, regexes = [], list(_as_tuple(d.get("regex")))
    for g in _as_tuple(d.get("match")):
        (regexes if g.startswith("re:") else globs).append(g[3:] if g.startswith("re:") else g)
    ndim = d.get("ndim")
    if ndim is not None and (isinstance(ndim, bool) or not isinstance(ndim, int)):
        raise LowbitError(f"rule ndim must be an integer, got {ndim!r}")
    pad = d.get("pad", True)
    if not isinstance(pad, bool):
        raise LowbitError(f"rule pad must be true or false, got {pad!r}")
    method = d.get("scale_method")
    try:
        action = scheme_from_spec(spec, scale_method=method, pad=pad)
    except LowbitError as exc:
        raise LowbitError(f"plan rule {_rule_text(d)}: {exc}") from None
    if action is None and (method is not None or "pad" in d or d.get("activations")):
        raise LowbitError(
            f"plan rule {_rule_text(d)}: 'keep' takes no scale_method, pad or activations"
        )
    return PlanRule(
        action=action,
        match=tuple(globs),
        regex=tuple(regexes),
        component=_as_tuple(d.get("component")),
        ndim=ndim,
        activations=activation_format(d.get("activations")),
    )


def _rule_text(d: Mapping[str, Any]) -> str:
    keys = [k for k in ("match", "regex", "component", "ndim") if k in d]
    return "{" + ", ".join(f"{k}: {d[k]!r}" for k in keys) + "}"


def _as_tuple(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    return (str(v),) if isinstance(v, str) else tuple(str(x) for x in v)
