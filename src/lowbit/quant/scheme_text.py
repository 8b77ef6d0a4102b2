"""The one text form of a scheme, ``FORMAT[:gN|:ch|:t][:SCALEFMT][:asym][:dq]``, and presets.

Every command and plan file builds its schemes here, so one string means one scheme
everywhere (``lowbit quantize``, ``quantize-tensor``, ``compare``, ``eval --schemes``,
``plan --precisions``, plan-file rules):

- ``FORMAT`` is a catalog name or alias (``int4``, ``nf4``, ``fp8_e4m3``, ``fp4``), an OCP MX
  block format (``mxfp4``, ``mxfp6``, ``mxfp8``, ``mxint8``), or a preset (:data:`PRESETS`:
  llama.cpp's ``q8_0``, ``q4_0``, ``q5_0``), which takes no further tokens.
- Granularity: ``gN`` (groups of N along the rows), ``ch`` (one scale per output channel),
  ``t`` (one scale per tensor), ``bRxC`` (tiles of R rows by C columns: ``fp8_block`` is
  ``fp8_e4m3:b128x128``, DeepSeek-V3's and compressed-tensors' FP8 blocks). **Left out, a format gets the weight layout**: per output
  channel (axis 0) for integer and float formats, QLoRA's blocks of 64 for ``nf4``, blocks of
  32 for MX formats; ``fp32``/``fp16``/``bf16`` alone are plain casts (:class:`Cast`).
- ``axA``: the channel axis, or the axis groups run along (default 0 per channel, -1 groups).
- ``SCALEFMT``: the scales' format, ``fp32`` (default), ``fp16``, ``bf16``, ``e8m0``, ``e4m3``.
- ``ts``: two-level scales (a float32 tensor scale over E4M3 group scales, NVFP4's);
  ``floor``/``carry``/``ceil``/``ct``: an MX format's E8M0 scale rule
  (:data:`lowbit.quant.scheme.MX_SCALE_RULES`; ``floor``, OCP's, is the default).
- ``asym``: integer formats get a zero point; ``dq``: NF4 double quantization;
  ``restricted``: signed integers use the symmetric range; a scale method name
  (``mse``, ``percentile``, ``meanstd``, ``absmax``, ``meanabs``, ``ggml``: llama.cpp's
  rounding, which ``q4_0`` = ``int4:g32:fp16:ggml`` uses).

:attr:`lowbit.quant.scheme.Scheme.label` writes this form back; :func:`format_scheme` is the
same. ``nvfp4`` is NVIDIA NVFP4, ``fp4:g16:e4m3:ts`` (E2M1 in groups of 16, E4M3 group scales
under a float32 tensor scale), and may take further tokens. llama.cpp's Q4_1/Q5_1 (an FP16
minimum per block) are refused with the reason: lowbit's zero points are integers, and the
planner prices only what the quantizer makes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from lowbit.errors import LowbitError, UnknownFormatError
from lowbit.formats.catalog import MX_FORMATS
from lowbit.formats.catalog import format as _lookup
from lowbit.formats.mx import is_mx_name
from lowbit.quant.ggml_tensor import block_type_name, mix_error, mix_name
from lowbit.quant.scheme import (
    CAST_FORMATS,
    Cast,
    Granularity,
    ScaleMethod,
    Scheme,
    canonical_scale_format,
)

__all__ = [
    "ALIASES",
    "GRANULARITY_TOKENS",
    "PRESETS",
    "REFUSED",
    "format_scheme",
    "parse_scheme",
]

#: Named schemes: llama.cpp's legacy symmetric block types (ggml-common.h: 32 values share an
#: FP16 scale), rounded exactly as llama.cpp rounds them (scale method ``ggml``) in every
#: output format and in ``eval --schemes``. lowbit's own absmax rounding of the same layout
#: has its own name, ``int4:g32:fp16`` (``int8:g32:fp16``, ``int5:g32:fp16``).
PRESETS: dict[str, dict[str, Any]] = {
    "q8_0": {"format": "int8", "group_size": 32, "scale_format": "float16", "scale_method": "ggml"},
    "q4_0": {"format": "int4", "group_size": 32, "scale_format": "float16", "scale_method": "ggml"},
    "q5_0": {"format": "int5", "group_size": 32, "scale_format": "float16", "scale_method": "ggml"},
}
#: Names people type that lowbit cannot quantize to, with the reason and what to use instead.
REFUSED: dict[str, str] = {
    "q4_1": "llama.cpp's Q4_1 stores an FP16 minimum per block, and lowbit's zero points are "
    "integers at the element width; use int4:g32:fp16:asym",
    "q5_1": "llama.cpp's Q5_1 stores an FP16 minimum per block, and lowbit's zero points are "
    "integers at the element width; use int5:g32:fp16:asym",
}
#: Names that stand for a longer text form (and may take further tokens after them).
ALIASES: dict[str, str] = {"nvfp4": "fp4:g16:e4m3:ts", "fp8_block": "fp8_e4m3:b128x128"}
_TILE = re.compile(r"b(\d+)x(\d+)")
#: MX scale-rule tokens.
_RULES = ("floor", "carry", "ceil", "ct")
#: Granularity tokens of the text form.
GRANULARITY_TOKENS = {"ch": "channel", "channel": "channel", "t": "tensor", "tensor": "tensor"}
_TOKENS_HELP = (
    "tokens: gN (groups of N), ch (per channel), t (per tensor), bRxC (tiles), axA (axis), "
    "a scale format "
    "(fp32, fp16, bf16, e8m0, e4m3), ts (tensor scale), asym, dq, restricted, an MX scale "
    "rule (floor, carry, ceil, ct), a scale method (absmax, percentile, meanstd, mse, "
    "meanabs, ggml)"
)
_METHODS = {m.value for m in ScaleMethod}
_FIELDS = {f.name for f in dataclasses.fields(Scheme)}


def format_scheme(scheme: Scheme | Cast) -> str:
    """The text form of a scheme (its :attr:`~lowbit.quant.scheme.Scheme.label`)."""
    return scheme.label


def parse_scheme(spec: Any, **overrides: Any) -> Scheme | Cast:
    """The scheme a string, dict, :class:`Scheme` or :class:`Cast` names, with field overrides.

    Args:
        spec: the text form (see the module docstring), a preset name, ``Scheme.to_dict()``
            (with ``version``), a dict of Scheme fields (a missing granularity gets the weight
            layout, as in text), or a Scheme/Cast (returned as is when no override is given).
        **overrides: Scheme fields set on top of what ``spec`` says (the CLI's ``--group``,
            ``--axis``, ``--asym`` -> ``symmetric=False``, ``--scale-format``,
            ``--scale-method`` ...). None values are ignored. ``group_size`` makes the
            scheme per group (replacing ``ch``/``t``); ``axis`` alone with no granularity
            makes it per channel along that axis.

    Returns:
        A :class:`~lowbit.quant.scheme.Scheme`, or a :class:`~lowbit.quant.scheme.Cast` for a
        bare ``fp32``/``fp16``/``bf16`` with no scale option.

    Raises:
        LowbitError: an unknown format, token, preset option or field, a refused name
            (``nvfp4``, ``q4_1``, ``q5_1``), or a combination the quantizer cannot make
            (``--asym`` with a float format); the message names the scheme and the bad part.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - _FIELDS)
    if unknown:
        raise LowbitError(f"unknown scheme option(s) {unknown}; allowed: {sorted(_FIELDS)}")
    if isinstance(spec, (Scheme, Cast)):
        if not given:
            return spec
        kw = (
            {"format": spec.dtype}
            if isinstance(spec, Cast)
            else {k: v for k, v in spec.to_dict().items() if k != "version"}
        )
        return _build(kw, given, repr(spec.label))
    if isinstance(spec, str):
        return _build(_parse_text(spec), given, repr(spec))
    if isinstance(spec, Mapping):
        shown = repr(dict(spec))
        if "version" in spec:
            try:
                scheme = Scheme.from_dict(dict(spec))
            except LowbitError as exc:
                raise LowbitError(f"scheme {shown}: {exc}") from None
            return parse_scheme(scheme, **given)
        if spec.get("cast") is True and set(spec) == {"format", "cast"}:  # Cast.to_dict()
            cast = parse_scheme(str(spec["format"]))
            if not isinstance(cast, Cast):
                raise LowbitError(f"scheme {shown}: {spec['format']} is not a plain cast format")
            return parse_scheme(cast, **given)
        bad = sorted(set(spec) - _FIELDS)
        if bad:
            raise LowbitError(
                f"scheme {shown}: unknown field(s) {', '.join(_field_names(bad))}; allowed: "
                f"{', '.join(sorted(_FIELDS))}"
            )
        if "format" not in spec:
            raise LowbitError(f"scheme {shown} needs a format")
        kw = {k: v for k, v in spec.items() if v is not None}
        if isinstance(kw.get("granularity"), str) and kw["granularity"].lower() == "none":
            kw.pop("granularity")  # a plain cast, as the planner wrote one
        return _build(kw, given, shown)
    raise LowbitError(
        f"cannot read {spec!r} as a scheme: give a string (e.g. 'int4:g128'), a dict or a Scheme"
    )


def _parse_text(text: str) -> dict[str, Any]:
    parts = [p.strip() for p in text.strip().lower().split(":")]
    if parts[0] in ALIASES:
        parts = ALIASES[parts[0]].split(":") + parts[1:]
    head = parts[0]
    if not head:
        raise LowbitError(f"scheme {text!r}: empty format (write e.g. int4:g128)")
    if head in REFUSED:
        raise LowbitError(f"scheme {text!r}: {head} is not supported: {REFUSED[head]}")
    if head in PRESETS:
        if len(parts) > 1:
            raise LowbitError(
                f"scheme {text!r}: preset {head} takes no options (it is llama.cpp's rounding "
                f"of {_preset_text(head)}; for lowbit's own rounding write {_preset_text(head)} "
                f"with your changes instead)"
            )
        return dict(PRESETS[head])
    kw: dict[str, Any] = {"format": head}
    seen: dict[str, str] = {}

    def put(key: str, value: Any, tok: str) -> None:
        if key in seen:
            raise LowbitError(f"scheme {text!r}: {tok!r} repeats {seen[key]!r}")
        seen[key] = tok
        kw[key] = value

    for tok in parts[1:]:
        if not tok:
            raise LowbitError(f"scheme {text!r}: empty token (two ':' in a row)")
        if tok.startswith("g") and tok[1:].isdecimal():  # isdigit() passes "²", int() not
            if len(tok) > 10:  # and int() refuses 4,300 digits
                raise LowbitError(f"scheme {_clip(text)}: group size {_clip(tok[1:])} is too large")
            put("granularity", "group", tok)
            kw["group_size"] = int(tok[1:])
        elif _TILE.fullmatch(tok):
            rows, cols = _TILE.fullmatch(tok).groups()  # type: ignore[union-attr]
            put("granularity", "tile", tok)
            kw["block_shape"] = (int(rows), int(cols))
        elif tok in GRANULARITY_TOKENS:
            put("granularity", GRANULARITY_TOKENS[tok], tok)
        elif tok.startswith("ax") and tok[2:].lstrip("-").isdecimal():
            if len(tok) > 6:
                raise LowbitError(f"scheme {_clip(text)}: axis {_clip(tok[2:])} is out of range")
            put("axis", int(tok[2:]), tok)
        elif tok == "asym":
            put("symmetric", False, tok)
        elif tok == "dq":
            put("double_quant", True, tok)
        elif tok == "restricted":
            put("restricted_range", True, tok)
        elif tok == "ts":
            put("tensor_scale", True, tok)
        elif tok in _RULES:
            put("scale_rule", tok, tok)
        elif tok in _METHODS:
            put("scale_method", tok, tok)
        else:
            try:
                scale = canonical_scale_format(tok)
            except LowbitError:
                try:
                    known = _lookup(tok).name
                except LowbitError:
                    known = None
                if known is not None:
                    raise LowbitError(
                        f"scheme {text!r}: scales cannot be stored in {known} ({tok!r}); "
                        f"scale formats: fp32, fp16, bf16, e8m0, e4m3"
                    ) from None
                raise LowbitError(
                    f"scheme {text!r}: unknown token {tok!r}; {_TOKENS_HELP}"
                ) from None
            put("scale_format", scale, tok)
    return kw


def _build(kw: dict[str, Any], given: dict[str, Any], shown: str) -> Scheme | Cast:
    kw = dict(kw)
    if "group_size" in given:
        kw.update(granularity="group", group_size=given["group_size"])
        if kw.get("axis") is not None and "axis" not in given and kw["axis"] == 0:
            kw.pop("axis")  # a per-channel axis is not the axis groups run along
    kw.update({k: v for k, v in given.items() if k != "group_size"})
    gran = kw.get("granularity")
    if isinstance(gran, Granularity):
        gran = gran.value
    name = str(kw["format"]).strip().lower()
    try:
        canon = name if is_mx_name(name) else _lookup(name).name
    except UnknownFormatError as exc:
        _llama_name(name, shown)
        raise LowbitError(
            f"scheme {shown}: {exc}; MX formats: {', '.join(MX_FORMATS)}; presets: "
            f"{', '.join(PRESETS)}"
        ) from None
    if gran is None and kw.get("group_size") is None:
        scaled = {"axis", "scale_format", "scale_method", "double_quant", "restricted_range",
                  "tensor_scale", "scale_rule"}  # fmt: skip
        if canon in CAST_FORMATS and kw.get("symmetric", True):
            if not scaled & set(kw):
                return Cast(canon)
            if scaled & set(kw) == {"scale_method"}:
                raise LowbitError(
                    f"scheme {shown} is a plain cast to {canon}: it has no scale method"
                )
        if kw.get("axis") is None and canon != "nf4" and not is_mx_name(canon):
            kw["granularity"] = "channel"  # the weight layout: one scale per output channel
    try:
        return Scheme(**kw)
    except LowbitError as exc:
        raise LowbitError(f"scheme {shown}: {exc}") from None
    except TypeError as exc:  # a non-field key slipped through a dict
        raise LowbitError(f"scheme {shown}: {exc}") from None


def _llama_name(name: str, shown: str) -> None:
    """Raise the one error for a llama.cpp block type or mix name given as a scheme."""
    if mix_name(name) is not None:
        raise mix_error(name, where=f"scheme {shown}: ")
    block = block_type_name(name)
    if block is not None:
        raise LowbitError(
            f"scheme {shown}: {name} is llama.cpp's {block} block type, which has no lowbit "
            f"scheme: lowbit.quantize(w, {name!r}) gives one tensor's {block} blocks; a model: "
            f"lowbit.quantize_model(model, {name!r}, out, out_format='gguf') writes "
            f"llama-quantize's mix of that name (`lowbit quantize MODEL --to {name} "
            f"--out-format gguf`)"
        )


def _preset_text(name: str) -> str:
    """The preset's layout in the text form, without llama.cpp's rounding (``int4:g32:fp16``)."""
    return Scheme(**{k: v for k, v in PRESETS[name].items() if k != "scale_method"}).label


def _field_names(names: Any) -> list[str]:
    """Field names as an error message shows them: plain when they are plain words, else
    ``repr`` (a key with a newline or control character must not break the one-line error)."""
    return [k if str(k).isidentifier() else repr(k) for k in sorted(names, key=str)]


def _clip(text: str) -> str:
    """A user's text for a message: its repr, cut to 60 characters."""
    r = repr(text)
    return r if len(r) <= 60 else r[:57] + "..."
